/**
 * Tool calls in model output, per model family (the formats vLLM's parsers of
 * the same names read):
 * - hermes (Qwen2.5, Qwen3): `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`, repeated;
 * - llama3_json (Llama 3.1/3.2): the whole answer is `{"name": …, "parameters": {…}}`,
 *   optionally after `<|python_tag|>`, several separated by `;`;
 * - mistral: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}` (v3 tokenizers),
 *   or `name[ARGS]{…}` per call (v11+).
 * A parser finds where calls begin and parses that region whole; text it cannot
 * parse as calls stays the model's text.
 */
import { randomBytes } from "node:crypto";
import type { GrammarPart, TagPart } from "../engine/grammar.js";
import { heldPrefix as heldMarker } from "./reasoning-parser.js";

export interface ParsedToolCall {
  name: string;
  /** The arguments object as JSON text: the model's own, without whitespace outside strings. */
  arguments: string;
}

/** A call seen so far while streaming: its name, and the start of its arguments (the same text ParsedToolCall ends with). */
export interface PartialToolCall {
  name: string;
  arguments: string;
}

/** A function a constrained answer may call: its name and its parameters' JSON schema (text). */
export interface CallableFunction {
  name: string;
  parameters: string;
}

export interface ToolParser {
  readonly name: ToolParserName;
  /** The marker is a special token: decode with special tokens kept, or it is lost. */
  readonly needsSpecialTokens: boolean;
  /** Index in `content` where the calls begin, or -1. */
  findStart(content: string): number;
  /** Characters at the end of `content` (with no start found) that may still become a start: held back while streaming. */
  pending(content: string): number;
  /** The calls in a region that begins at a start, and any text around them; null when it is not a well-formed call list. */
  parse(region: string): { calls: ParsedToolCall[]; text: string } | null;
  /**
   * The calls whose name and start of arguments can be read from a region that
   * is still growing, in order; the list stops at the first call it cannot read
   * yet (a call written another way is then only read whole, at the end).
   */
  partial(region: string): PartialToolCall[];
  /** The grammar of an answer that is one call (`one`) or several, each to one of `fns` with arguments valid for its parameters. */
  grammar(fns: readonly CallableFunction[], one: boolean): GrammarPart;
  /** A call id in the family's form. */
  newId(): string;
}

export const TOOL_PARSER_NAMES = ["hermes", "llama3_json", "mistral"] as const;
export type ToolParserName = (typeof TOOL_PARSER_NAMES)[number];

type Json = Record<string, unknown>;

/** The end of the JSON object or array starting at `from` (string-aware bracket matching), or -1. */
function jsonEnd(s: string, from: number): number {
  let depth = 0;
  let inString = false;
  for (let i = from; i < s.length; i++) {
    const c = s[i];
    if (inString) {
      if (c === "\\") i++;
      else if (c === "\"") inString = false;
    } else if (c === "\"") inString = true;
    else if (c === "{" || c === "[") depth++;
    else if (c === "}" || c === "]") {
      if (--depth === 0) return i + 1;
    }
  }
  return -1;
}

/** The JSON value at `from` (after whitespace) and where it ends, or null. */
function readJson(s: string, from: number): { value: unknown; raw: string; end: number } | null {
  const start = s.slice(from).search(/\S/);
  if (start < 0) return null;
  const at = from + start;
  const end = jsonEnd(s, at);
  if (end < 0) return null;
  try {
    return { value: JSON.parse(s.slice(at, end)), raw: s.slice(at, end), end };
  } catch {
    return null;
  }
}

const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

/** JSON text without whitespace outside strings: the same value, and a prefix of the text gives a prefix of the result. */
function compact(json: string): string {
  let out = "";
  let inString = false;
  for (let i = 0; i < json.length; i++) {
    const c = json[i]!;
    if (inString) {
      out += c;
      if (c === "\\") out += json[++i] ?? "";
      else if (c === "\"") inString = false;
    } else if (c === "\"") {
      inString = true;
      out += c;
    } else if (!/\s/.test(c)) out += c;
  }
  return out;
}

/** A call object that begins `{"name": "…", "arguments": {` (or "parameters"): the name, and where the arguments object starts. */
const CALL_HEAD = /^\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)/;

/** The call at the start of `text` (which may be cut short), read as CALL_HEAD allows; the arguments are as far as they go. */
function partialCall(text: string): (PartialToolCall & { end: number }) | null {
  const head = CALL_HEAD.exec(text);
  if (!head) return null;
  const name = JSON.parse(head[1]!) as string;
  const argsEnd = jsonEnd(text, head[0].length);
  return { name, arguments: compact(text.slice(head[0].length, argsEnd < 0 ? text.length : argsEnd)), end: argsEnd };
}

/**
 * `{name, arguments | parameters}` → a call; arguments must be an object (absent: {}), or JSON text of one.
 * `raw` is the object's text: arguments written in place are kept as written (compacted), the text streaming sent.
 */
function toCall(v: unknown, raw?: string): ParsedToolCall | null {
  if (!isObject(v) || typeof v.name !== "string" || v.name === "") return null;
  let args = v.arguments ?? v.parameters ?? {};
  if (typeof args === "string") {
    try {
      args = JSON.parse(args);
    } catch {
      return null;
    }
  }
  if (!isObject(args)) return null;
  const written = raw !== undefined ? partialCall(raw) : null;
  return { name: v.name, arguments: written && written.end >= 0 && written.name === v.name ? written.arguments : JSON.stringify(args) };
}

/** A call object's text as the grammar writes it: `{"name": "…", "<key>": ` + arguments + `}`. */
function callTag(fn: CallableFunction, argsKey: string, before: string, after: string): TagPart {
  return { type: "tag", begin: `${before}{"name": ${JSON.stringify(fn.name)}, "${argsKey}": `, content: { type: "json", schema: fn.parameters }, end: `}${after}` };
}

function allCalls(values: { value: unknown; raw?: string }[]): ParsedToolCall[] | null {
  const calls = values.map((v) => toCall(v.value, v.raw));
  return calls.length > 0 && calls.every((c) => c !== null) ? (calls as ParsedToolCall[]) : null;
}

const openAiId = (): string => `call_${randomBytes(12).toString("hex")}`;

/**
 * Call objects one after another from `from`, `sep` between them (whitespace
 * around it allowed): each one's text, the last maybe cut short (`end` -1).
 * Stops at the first thing that is not an object.
 */
function objectRun(s: string, from: number, sep: string): { raw: string; end: number }[] {
  const out: { raw: string; end: number }[] = [];
  let at = from;
  for (;;) {
    while (at < s.length && /\s/.test(s[at]!)) at++;
    if (s[at] !== "{") return out;
    const end = jsonEnd(s, at);
    out.push({ raw: s.slice(at, end < 0 ? s.length : end), end });
    if (end < 0) return out;
    const next = s.slice(end).match(/^\s*/)![0].length + end;
    if (!s.startsWith(sep, next)) return out;
    at = next + sep.length;
  }
}

/** The readable calls at the start of a run of call objects (see ToolParser.partial). */
function partialRun(runs: { raw: string; end: number }[]): PartialToolCall[] {
  const out: PartialToolCall[] = [];
  for (const r of runs) {
    const call = partialCall(r.raw);
    if (!call) break;
    out.push({ name: call.name, arguments: call.arguments });
    if (call.end < 0) break;
  }
  return out;
}

const TOOL_CALL = "<tool_call>";
const TOOL_CALL_END = "</tool_call>";

export const hermes: ToolParser = {
  name: "hermes",
  needsSpecialTokens: false,
  findStart: (c) => c.indexOf(TOOL_CALL),
  pending: (c) => heldMarker(c, TOOL_CALL),
  parse(region) {
    const calls: ParsedToolCall[] = [];
    let text = "";
    let at = 0;
    while (at < region.length) {
      const open = region.indexOf(TOOL_CALL, at);
      if (open < 0) break;
      text += region.slice(at, open);
      const json = readJson(region, open + TOOL_CALL.length);
      const call = json ? toCall(json.value, json.raw) : null;
      if (!json || !call) return null;
      calls.push(call);
      const rest = region.slice(json.end);
      // The closing tag may be missing when the model stopped right after the object.
      const close = rest.match(/^\s*<\/tool_call>/);
      if (!close && rest.trim() !== "") return null;
      at = json.end + (close ? close[0].length : rest.length);
    }
    text += region.slice(at);
    return calls.length > 0 ? { calls, text: text.trim() } : null;
  },
  partial(region) {
    const out: PartialToolCall[] = [];
    for (let at = region.indexOf(TOOL_CALL); at >= 0; at = region.indexOf(TOOL_CALL, at)) {
      const [run] = objectRun(region, at + TOOL_CALL.length, TOOL_CALL_END);
      const call = run ? partialCall(run.raw) : null;
      if (!call) break;
      out.push({ name: call.name, arguments: call.arguments });
      if (call.end < 0 || run!.end < 0) break;
      at = region.indexOf(run!.raw, at) + run!.raw.length;
    }
    return out;
  },
  // Qwen's templates: <tool_call>\n{"name": …, "arguments": …}\n</tool_call>, a newline between calls.
  grammar: (fns, one) => ({ type: "tags", tags: fns.map((f) => callTag(f, "arguments", `${TOOL_CALL}\n`, `\n${TOOL_CALL_END}`)), separator: "\n", one }),
  newId: openAiId,
};

const PYTHON_TAG = "<|python_tag|>";

/** A llama3_json region without its leading whitespace and <|python_tag|>. */
function llamaBody(region: string): string {
  const s = region.trimStart();
  return s.startsWith(PYTHON_TAG) ? s.slice(PYTHON_TAG.length) : s;
}

export const llama3Json: ToolParser = {
  name: "llama3_json",
  needsSpecialTokens: false,
  findStart(c) {
    const at = c.search(/\S/);
    if (at < 0) return -1;
    return c.startsWith("{", at) || c.startsWith(PYTHON_TAG, at) ? at : -1;
  },
  pending(c) {
    const t = c.trimStart();
    return t === "" || PYTHON_TAG.startsWith(t) ? c.length : 0;
  },
  parse(region) {
    const s = llamaBody(region);
    const values: { value: unknown; raw: string }[] = [];
    let at = 0;
    for (;;) {
      const json = readJson(s, at);
      if (!json) return null;
      values.push(json);
      const sep = s.slice(json.end).match(/^\s*;\s*/);
      at = json.end + (sep ? sep[0].length : 0);
      if (!sep || at >= s.length) break;
    }
    if (s.slice(at).trim() !== "") return null;
    const calls = allCalls(values);
    return calls ? { calls, text: "" } : null;
  },
  partial: (region) => partialRun(objectRun(llamaBody(region), 0, ";")),
  // Llama 3.1/3.2's JSON calls: {"name": …, "parameters": …}, "; " between calls.
  grammar: (fns, one) => ({ type: "tags", tags: fns.map((f) => callTag(f, "parameters", "", "")), separator: "; ", one }),
  newId: openAiId,
};

const TOOL_CALLS = "[TOOL_CALLS]";
const ARGS = "[ARGS]";

export const mistral: ToolParser = {
  name: "mistral",
  needsSpecialTokens: true,
  findStart: (c) => c.indexOf(TOOL_CALLS),
  pending: (c) => heldMarker(c, TOOL_CALLS),
  parse(region) {
    const body = region.slice(TOOL_CALLS.length);
    if (!body.includes(ARGS)) {
      const json = readJson(body, 0);
      if (!json || body.slice(json.end).trim() !== "") return null;
      const list = Array.isArray(json.value) ? json.value : [json.value];
      // Each item's own text, so its arguments read as the model wrote them.
      const raws = Array.isArray(json.value) ? objectRun(json.raw, 1, ",") : [{ raw: json.raw }];
      const calls = allCalls(list.map((value, i) => ({ value, raw: raws.length === list.length ? raws[i]!.raw : undefined })));
      return calls ? { calls, text: "" } : null;
    }
    // v11+: name[ARGS]{…}, each call after its own [TOOL_CALLS].
    const calls: ParsedToolCall[] = [];
    for (const part of region.split(TOOL_CALLS).slice(1)) {
      const args = part.indexOf(ARGS);
      if (args < 0) return null;
      const json = readJson(part, args + ARGS.length);
      const name = part.slice(0, args).trim();
      if (!json || part.slice(json.end).trim() !== "" || name === "" || !isObject(json.value)) return null;
      calls.push({ name, arguments: compact(json.raw) });
    }
    return calls.length > 0 ? { calls, text: "" } : null;
  },
  partial(region) {
    const body = region.slice(TOOL_CALLS.length);
    if (!body.includes(ARGS)) {
      const open = body.match(/^\s*\[/);
      return open ? partialRun(objectRun(body, open[0].length, ",")) : [];
    }
    const out: PartialToolCall[] = [];
    for (const part of region.split(TOOL_CALLS).slice(1)) {
      const args = part.indexOf(ARGS);
      const brace = args < 0 ? -1 : part.indexOf("{", args + ARGS.length);
      if (brace < 0 || part.slice(args + ARGS.length, brace).trim() !== "" || part.slice(0, args).trim() === "") break;
      const end = jsonEnd(part, brace);
      out.push({ name: part.slice(0, args).trim(), arguments: compact(part.slice(brace, end < 0 ? part.length : end)) });
      if (end < 0) break;
    }
    return out;
  },
  // The v3 form, which v3 and later templates read: [TOOL_CALLS][{"name": …, "arguments": …}, …].
  // (XGrammar takes the list as a tag around the calls, not as a sequence ending after them.)
  grammar: (fns, one) => ({
    type: "tag", begin: `${TOOL_CALLS}[`, content: { type: "tags", tags: fns.map((f) => callTag(f, "arguments", "", "")), separator: ", ", one }, end: "]",
  }),
  // Mistral's templates refuse tool_call_ids that are not 9 alphanumeric characters.
  newId: () => randomBytes(9).toString("base64url").replace(/[^A-Za-z0-9]/g, "0").slice(0, 9),
};

const PARSERS: Record<ToolParserName, ToolParser> = { hermes, llama3_json: llama3Json, mistral };

export function toolParser(name: ToolParserName): ToolParser {
  return PARSERS[name];
}

/** The parser a chat template's tool format calls for, or null when it renders no tools we know. */
export function detectToolParser(template: string): ToolParser | null {
  if (template.includes(TOOL_CALL)) return hermes;
  if (template.includes(TOOL_CALLS)) return mistral;
  if (template.includes(PYTHON_TAG) || (template.includes("tools") && template.includes("\"parameters\""))) return llama3Json;
  return null;
}

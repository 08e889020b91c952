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
import { heldPrefix as heldMarker } from "./reasoning-parser.js";

export interface ParsedToolCall {
  name: string;
  /** The arguments object as JSON text. */
  arguments: string;
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
function readJson(s: string, from: number): { value: unknown; end: number } | null {
  const start = s.slice(from).search(/\S/);
  if (start < 0) return null;
  const at = from + start;
  const end = jsonEnd(s, at);
  if (end < 0) return null;
  try {
    return { value: JSON.parse(s.slice(at, end)), end };
  } catch {
    return null;
  }
}

const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

/** `{name, arguments | parameters}` → a call; arguments must be an object (absent: {}), or JSON text of one. */
function toCall(v: unknown): ParsedToolCall | null {
  if (!isObject(v) || typeof v.name !== "string" || v.name === "") return null;
  let args = v.arguments ?? v.parameters ?? {};
  if (typeof args === "string") {
    try {
      args = JSON.parse(args);
    } catch {
      return null;
    }
  }
  return isObject(args) ? { name: v.name, arguments: JSON.stringify(args) } : null;
}

function allCalls(values: unknown[]): ParsedToolCall[] | null {
  const calls = values.map(toCall);
  return calls.length > 0 && calls.every((c) => c !== null) ? (calls as ParsedToolCall[]) : null;
}

const openAiId = (): string => `call_${randomBytes(12).toString("hex")}`;

const TOOL_CALL = "<tool_call>";

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
      const call = json ? toCall(json.value) : null;
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
  newId: openAiId,
};

const PYTHON_TAG = "<|python_tag|>";

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
    let s = region.trimStart();
    if (s.startsWith(PYTHON_TAG)) s = s.slice(PYTHON_TAG.length);
    const values: unknown[] = [];
    let at = 0;
    for (;;) {
      const json = readJson(s, at);
      if (!json) return null;
      values.push(json.value);
      const sep = s.slice(json.end).match(/^\s*;\s*/);
      at = json.end + (sep ? sep[0].length : 0);
      if (!sep || at >= s.length) break;
    }
    if (s.slice(at).trim() !== "") return null;
    const calls = allCalls(values);
    return calls ? { calls, text: "" } : null;
  },
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
      const calls = allCalls(Array.isArray(json.value) ? json.value : [json.value]);
      return calls ? { calls, text: "" } : null;
    }
    // v11+: name[ARGS]{…}, each call after its own [TOOL_CALLS].
    const values: unknown[] = [];
    for (const part of region.split(TOOL_CALLS).slice(1)) {
      const args = part.indexOf(ARGS);
      if (args < 0) return null;
      const json = readJson(part, args + ARGS.length);
      if (!json || part.slice(json.end).trim() !== "") return null;
      values.push({ name: part.slice(0, args).trim(), arguments: json.value });
    }
    const calls = allCalls(values);
    return calls ? { calls, text: "" } : null;
  },
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

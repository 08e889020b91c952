/**
 * Grammar-constrained decoding on XGrammar's WebAssembly build: one compiler
 * per tokenizer (compiled grammars cached by their spec), one matcher per
 * request. Each step the matcher fills the request's token mask (bit t set =
 * token t may come next); after sampling it accepts the token. It ends once a
 * stop token completes the grammar.
 */
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import type * as XGrammar from "@mlc-ai/web-xgrammar";
import type { TextTokenizer } from "../model/tokenizer.js";

/** What a request is constrained to. JSON is compact: no whitespace between tokens (vLLM's any_whitespace off). */
export type GrammarSpec =
  | { type: "json_schema"; schema: string }
  | { type: "json_object" }
  | { type: "regex"; pattern: string }
  | { type: "ebnf"; grammar: string }
  | { type: "composed"; root: GrammarPart }
  /** One think block of at most `maxTokens` tokens (optional; already open when `opened`), then `then`. */
  | { type: "think_then"; maxTokens: number; opened: boolean; then: GrammarSpec };

/**
 * A grammar composed of parts (XGrammar's structural tags): each part keeps its
 * own rule names, so JSON schemas can sit side by side. JSON is compact as above.
 */
export type GrammarPart =
  /** `loose`: properties besides the schema's allowed (json_object). */
  | { type: "json"; schema: string; loose?: boolean }
  | { type: "const"; text: string }
  /** Any text: as a tag's content, any text up to the tag's end. */
  | { type: "any_text" }
  | { type: "regex"; pattern: string }
  | { type: "ebnf"; grammar: string }
  | { type: "sequence"; parts: GrammarPart[] }
  | { type: "or"; parts: GrammarPart[] }
  | { type: "tag"; begin: string; content: GrammarPart; end: string }
  /** One or more tags, `separator` between them; `one`: exactly one. */
  | { type: "tags"; tags: TagPart[]; separator: string; one: boolean };

export type TagPart = Extract<GrammarPart, { type: "tag" }>;

/** A grammar the compiler refused (an invalid schema or an unsupported feature); the message names the problem. */
export class GrammarError extends Error {}

type XG = typeof XGrammar;
let xgrammar: XG | undefined;
/** The last fatal message the WebAssembly module printed: its only account of why a compile aborted. */
let lastFatal = "";

/**
 * The package is a UMD bundle inside a "type": "module" package, so Node can
 * neither import nor require it: it is evaluated as CommonJS here. The .wasm is
 * inlined (base64) in the bundle, so nothing is fetched. Its console is ours,
 * to read the messages of failed compiles.
 */
function loadXGrammar(): XG {
  if (xgrammar) return xgrammar;
  const require = createRequire(import.meta.url);
  const file = path.join(path.dirname(require.resolve("@mlc-ai/web-xgrammar/package.json")), "lib", "index.js");
  const mod = { exports: {} as XG };
  const keepFatal = (m: unknown): void => {
    if (String(m).startsWith("[FATAL]")) lastFatal = String(m);
  };
  const quiet = Object.assign(Object.create(console) as Console, { log: keepFatal, error: keepFatal, warn: keepFatal });
  // Evaluating a pinned, local bundle (see above).
  const run = new Function("exports", "module", "require", "__filename", "__dirname", "console", fs.readFileSync(file, "utf8")) as
    (...args: unknown[]) => void;
  run(mod.exports, mod, createRequire(file), file, path.dirname(file), quiet);
  return (xgrammar = mod.exports);
}

/** Runs a compile; an abort inside the module becomes a GrammarError with the module's own message. */
async function compiling<T>(what: string, f: () => Promise<T>): Promise<T> {
  lastFatal = "";
  try {
    return await f();
  } catch (e) {
    if (e instanceof GrammarError) throw e;
    const why = lastFatal.replace(/^\[FATAL\][^:]*:\d+:\s*/, "").trim() || (e instanceof Error ? e.message : String(e));
    throw new GrammarError(`${what}: ${why}`);
  }
}

/** XGrammar's vocabulary type, as its Python helper decides it: byte-fallback pieces (<0x0A>), GPT-2 byte-level (Ġ), or raw. */
function vocabType(tok: TextTokenizer): { type: string; prependSpace: boolean } {
  if (tok.tokenId("<0x0A>") !== undefined) return { type: "byte_fallback", prependSpace: tok.tokenPiece(tok.encode("a", false)[0] ?? -1)?.startsWith("▁") ?? false };
  if (tok.tokenId("Ġ") !== undefined || tok.tokenId("Ċ") !== undefined) return { type: "byte_level", prependSpace: false };
  return { type: "raw", prependSpace: false };
}

/** Compiles grammars for one model's vocabulary; compiled grammars are cached by their spec. */
export class GrammarCompiler {
  private compiler: Promise<XGrammar.GrammarCompiler> | null = null;
  private readonly cache = new Map<string, Promise<Grammar>>();
  private readonly compiled = new Map<string, Grammar>();

  constructor(
    private readonly tokenizer: TextTokenizer,
    /** The logits' width (config vocab_size, which may exceed the tokenizer's). */
    readonly vocabSize: number,
    /** Tokens that end the output: allowed only where the grammar can end. */
    private readonly stopTokenIds: readonly number[],
  ) {}

  /** Special tokens other than the stop tokens become empty entries, which XGrammar never allows. */
  private build(): Promise<XGrammar.GrammarCompiler> {
    this.compiler ??= (async () => {
      const xg = loadXGrammar();
      const vocab = Array.from({ length: this.vocabSize }, (_, id) =>
        this.tokenizer.specialIds.has(id) ? "" : (this.tokenizer.tokenPiece(id) ?? ""));
      const { type, prependSpace } = vocabType(this.tokenizer);
      const info = await xg.TokenizerInfo.createTokenizerInfo(vocab, type, prependSpace, this.vocabSize, [...this.stopTokenIds]);
      // XGrammar's own cache is off: a compile that aborts leaves its entry pending, and the same grammar
      // sent again would wait on it forever. Ours (below) keeps only grammars that compiled.
      return xg.GrammarCompiler.createGrammarCompiler(info, false);
    })();
    return this.compiler;
  }

  /** Throws GrammarError for a grammar XGrammar refuses. */
  compile(spec: GrammarSpec): Promise<Grammar> {
    const key = JSON.stringify(spec);
    let hit = this.cache.get(key);
    if (!hit) {
      hit = this.compileGrammar(spec).then((g) => {
        this.compiled.set(key, g);
        return g;
      });
      this.cache.set(key, hit);
      hit.catch(() => this.cache.delete(key));
    }
    return hit;
  }

  /** A grammar compile() has already finished, else undefined. */
  ready(spec: GrammarSpec): Grammar | undefined {
    return this.compiled.get(JSON.stringify(spec));
  }

  /**
   * A think block's bound is kept by the matcher, not the grammar (XGrammar
   * compiles a bounded repetition far too slowly): the thinking grammar has an
   * unbounded block (any text up to its closing tag), and at the bound the
   * matcher moves to the grammar that closes it.
   */
  private async compileGrammar(spec: GrammarSpec): Promise<Grammar> {
    if (spec.type !== "think_then") return new Grammar(await this.compileNew(spec));
    const then = specPart(spec.then);
    const block = (begin: string): GrammarPart[] => [{ type: "tag", begin, content: { type: "any_text" }, end: THINK_END }, { type: "const", text: AFTER_THINK }, then];
    const thinking: GrammarPart = spec.opened ? { type: "sequence", parts: block("") } : { type: "or", parts: [{ type: "sequence", parts: block(THINK_START) }, then] };
    const [withThink, closing] = await Promise.all([
      this.compileNew({ type: "composed", root: thinking }),
      this.compileNew({ type: "composed", root: { type: "sequence", parts: [{ type: "const", text: THINK_END + AFTER_THINK }, then] } }),
    ]);
    return new Grammar(withThink, { maxTokens: spec.maxTokens, opened: spec.opened, closing, tokenText: (id) => this.tokenizer.decode([id], false) });
  }

  private async compileNew(spec: Exclude<GrammarSpec, { type: "think_then" }>): Promise<XGrammar.CompiledGrammar> {
    const c = await this.build();
    switch (spec.type) {
      case "json_schema": return compiling("invalid JSON schema", async () => c.compileGrammar(await jsonEbnf(spec.schema, true)));
      case "json_object": return compiling("JSON object", async () => c.compileGrammar(await jsonEbnf('{"type":"object"}', false)));
      case "regex": return compiling("invalid regex", () => c.compileStructuralTag({ type: "structural_tag", format: { type: "regex", pattern: spec.pattern } }));
      case "ebnf": return compiling("invalid grammar", () => c.compileGrammar(spec.grammar));
      case "composed": {
        const format = await structuralFormat(spec.root);
        return compiling("invalid grammar", () => c.compileStructuralTag({ type: "structural_tag", format }));
      }
    }
  }
}

const THINK_START = "<think>";
const THINK_END = "</think>";
/** What Qwen3 writes between a think block and its answer. */
const AFTER_THINK = "\n\n";

/** A spec as a part of a composed grammar. */
function specPart(spec: Exclude<GrammarSpec, { type: "think_then" }> | GrammarSpec): GrammarPart {
  switch (spec.type) {
    case "json_schema": return { type: "json", schema: spec.schema };
    case "json_object": return { type: "json", schema: '{"type":"object"}', loose: true };
    case "regex": return { type: "regex", pattern: spec.pattern };
    case "ebnf": return { type: "ebnf", grammar: spec.grammar };
    case "composed": return spec.root;
    case "think_then": throw new GrammarError("a think block cannot follow a think block");
  }
}

/**
 * XGrammar 0.1.27 writes the characters of a string with minLength or
 * maxLength as this class, which lets control characters in: JSON forbids them
 * unescaped, so the output would not parse. The fix excludes them, as its
 * other strings do.
 */
const LOOSE_STRING_CHAR = String.raw`[^\"\\\r\n]`;
const STRING_CHAR = String.raw`[^\0-\x1f\"\\\r\n]`;

/** A JSON schema as compact EBNF, the grammar of both json_schema and JSON parts. */
async function jsonEbnf(schema: string, strict: boolean): Promise<string> {
  const g = await compiling("invalid JSON schema", () => loadXGrammar().Grammar.fromJSONSchema(schema, false, -1, [",", ":"], strict));
  try {
    return g.toString().replaceAll(LOOSE_STRING_CHAR, STRING_CHAR);
  } finally {
    g.dispose();
  }
}

/** A part → XGrammar's structural tag format; JSON parts become their compact EBNF (XGrammar's own json_schema part allows any whitespace). */
async function structuralFormat(p: GrammarPart): Promise<XGrammar.StructuralTagFormat> {
  switch (p.type) {
    case "json": return { type: "grammar", grammar: await jsonEbnf(p.schema, p.loose !== true) };
    case "const": return { type: "const_string", value: p.text };
    case "any_text": return { type: "any_text" };
    case "regex": return { type: "regex", pattern: p.pattern };
    case "ebnf": return { type: "grammar", grammar: p.grammar };
    case "sequence": return { type: "sequence", elements: await Promise.all(p.parts.map(structuralFormat)) };
    case "or": return { type: "or", elements: await Promise.all(p.parts.map(structuralFormat)) };
    case "tag": return tagFormat(p);
    case "tags": return { type: "tags_with_separator", tags: await Promise.all(p.tags.map(tagFormat)), separator: p.separator, at_least_one: true, stop_after_first: p.one };
  }
}

async function tagFormat(p: TagPart): Promise<XGrammar.TagFormat> {
  return { type: "tag", begin: p.begin, content: await structuralFormat(p.content), end: p.end };
}

/** A think block's bound, kept by the matcher: past `maxTokens` tokens an open block is closed by moving to `closing`. */
interface ThinkBound {
  maxTokens: number;
  /** The prompt opened the block: the answer starts inside it. */
  opened: boolean;
  /** The grammar from the block's closing tag on. */
  closing: XGrammar.CompiledGrammar;
  tokenText(id: number): string;
}

/** A compiled grammar: requests each take a matcher of their own. */
export class Grammar {
  constructor(private readonly compiled: XGrammar.CompiledGrammar, private readonly bound?: ThinkBound) {}

  async matcher(): Promise<RequestGrammar> {
    const create = loadXGrammar().GrammarMatcher.createGrammarMatcher;
    if (!this.bound) return new RequestGrammar(await create(this.compiled));
    const [m, closing] = await Promise.all([create(this.compiled), create(this.bound.closing)]);
    return new RequestGrammar(m, { budget: new ThinkBudget(this.bound), closing });
  }
}

/** Counts a think block's tokens; says when the block must be closed. */
class ThinkBudget {
  private state: "undecided" | "thinking" | "over";
  private text = "";
  private tokens = 0;

  constructor(private readonly bound: ThinkBound) {
    this.state = bound.opened ? "thinking" : "undecided";
  }

  /** Takes an accepted token; true when the block is open at its bound and must now be closed. */
  take(id: number): boolean {
    if (this.state === "over") return false;
    this.tokens++;
    // Only the text that decides the state is kept: the start (is it "<think>"?), then a tail long enough to hold "</think>".
    this.text += this.bound.tokenText(id);
    if (this.state === "undecided") {
      if (!this.text.startsWith(THINK_START)) {
        if (!THINK_START.startsWith(this.text)) this.state = "over";
        return false;
      }
      this.state = "thinking";
      this.text = this.text.slice(THINK_START.length);
    }
    if (this.text.includes(THINK_END)) {
      this.state = "over"; // the model closed the block itself
      return false;
    }
    this.text = this.text.slice(-(THINK_END.length - 1));
    if (this.tokens < this.bound.maxTokens) return false;
    this.state = "over";
    return true;
  }
}

/**
 * One request's place in its grammar. dispose() frees its WebAssembly memory; the engine calls it when
 * the request ends, which can be while a step in flight makes the request's mask (a stop string or a
 * client's abort ends it then): the memory is freed once that mask is made.
 */
export class RequestGrammar {
  private disposed = false;
  private masking: Promise<Int32Array> | null = null;

  /** `think`: a think block's budget, and the matcher that takes over to close the block at its bound. */
  constructor(private m: XGrammar.GrammarMatcher, private think: { budget: ThinkBudget; closing: XGrammar.GrammarMatcher } | null = null) {}

  /** The next token's mask: ceil(vocab / 32) words, bit t set = token t allowed; undefined once disposed (the row is dropped). */
  nextMask(): Promise<Int32Array | undefined> {
    if (this.disposed) return Promise.resolve(undefined);
    const made = this.m.getNextTokenBitmask();
    this.masking = made;
    const settled = (): void => {
      if (this.masking !== made) return;
      this.masking = null;
      if (this.disposed) this.free();
    };
    made.then(settled, settled);
    return made;
  }

  /** False when the grammar does not allow `token` (the mask was not applied). */
  accept(token: number): boolean {
    if (!this.m.acceptToken(token)) return false;
    if (this.think?.budget.take(token)) {
      this.m.dispose();
      this.m = this.think.closing;
      this.think = null;
    }
    return true;
  }

  /** A stop token has completed the grammar. */
  get done(): boolean {
    return this.m.isTerminated();
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    if (!this.masking) this.free();
  }

  private free(): void {
    this.m.dispose();
    this.think?.closing.dispose();
  }
}

const compilers = new WeakMap<TextTokenizer, GrammarCompiler>();

/** The one compiler (and cache) per loaded tokenizer. */
export function grammarCompiler(tokenizer: TextTokenizer, vocabSize: number, stopTokenIds: readonly number[]): GrammarCompiler {
  let c = compilers.get(tokenizer);
  if (!c) compilers.set(tokenizer, (c = new GrammarCompiler(tokenizer, vocabSize, stopTokenIds)));
  return c;
}

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
  | { type: "composed"; root: GrammarPart };

/**
 * A grammar composed of parts (XGrammar's structural tags): each part keeps its
 * own rule names, so JSON schemas can sit side by side. JSON is compact as above.
 */
export type GrammarPart =
  | { type: "json"; schema: string }
  | { type: "const"; text: string }
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
      hit = this.compileNew(spec).then((c) => {
        const g = new Grammar(c);
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

  private async compileNew(spec: GrammarSpec): Promise<XGrammar.CompiledGrammar> {
    const c = await this.build();
    switch (spec.type) {
      case "json_schema": return compiling("invalid JSON schema", () => c.compileJSONSchema(spec.schema, false, -1, [",", ":"], true));
      case "json_object": return compiling("JSON object", () => c.compileJSONSchema('{"type":"object"}', false, -1, [",", ":"], false));
      case "regex": return compiling("invalid regex", () => c.compileStructuralTag({ type: "structural_tag", format: { type: "regex", pattern: spec.pattern } }));
      case "ebnf": return compiling("invalid grammar", () => c.compileGrammar(spec.grammar));
      case "composed": {
        const format = await structuralFormat(spec.root);
        return compiling("invalid grammar", () => c.compileStructuralTag({ type: "structural_tag", format }));
      }
    }
  }
}

/** A JSON schema as compact EBNF (the grammar compileJSONSchema makes for json_schema). */
async function jsonEbnf(schema: string): Promise<string> {
  const g = await compiling("invalid JSON schema", () => loadXGrammar().Grammar.fromJSONSchema(schema, false, -1, [",", ":"], true));
  try {
    return g.toString();
  } finally {
    g.dispose();
  }
}

/** A part → XGrammar's structural tag format; JSON parts become their compact EBNF (XGrammar's own json_schema part allows any whitespace). */
async function structuralFormat(p: GrammarPart): Promise<XGrammar.StructuralTagFormat> {
  switch (p.type) {
    case "json": return { type: "grammar", grammar: await jsonEbnf(p.schema) };
    case "const": return { type: "const_string", value: p.text };
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

/** A compiled grammar: requests each take a matcher of their own. */
export class Grammar {
  constructor(private readonly compiled: XGrammar.CompiledGrammar) {}

  async matcher(): Promise<RequestGrammar> {
    return new RequestGrammar(await loadXGrammar().GrammarMatcher.createGrammarMatcher(this.compiled));
  }
}

/** One request's place in its grammar. dispose() frees its WebAssembly memory; the engine calls it when the request ends. */
export class RequestGrammar {
  private disposed = false;

  constructor(private readonly m: XGrammar.GrammarMatcher) {}

  /** The next token's mask: ceil(vocab / 32) words, bit t set = token t allowed. */
  nextMask(): Promise<Int32Array> {
    return this.m.getNextTokenBitmask();
  }

  /** False when the grammar does not allow `token` (the mask was not applied). */
  accept(token: number): boolean {
    return this.m.acceptToken(token);
  }

  /** A stop token has completed the grammar. */
  get done(): boolean {
    return this.m.isTerminated();
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.m.dispose();
  }
}

const compilers = new WeakMap<TextTokenizer, GrammarCompiler>();

/** The one compiler (and cache) per loaded tokenizer. */
export function grammarCompiler(tokenizer: TextTokenizer, vocabSize: number, stopTokenIds: readonly number[]): GrammarCompiler {
  let c = compilers.get(tokenizer);
  if (!c) compilers.set(tokenizer, (c = new GrammarCompiler(tokenizer, vocabSize, stopTokenIds)));
  return c;
}

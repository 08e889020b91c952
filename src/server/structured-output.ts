/**
 * Structured outputs: a request's response_format (OpenAI) or
 * structured_outputs (vLLM: json, regex, choice, grammar), or a tool call that
 * tool_choice requires → the grammar its output must follow, and one matcher
 * per choice. A grammar XGrammar refuses is a 400 naming the field.
 */
import type { LoadedModel } from "../engine/engine-manager.js";
import { GrammarError, grammarCompiler, type Grammar, type GrammarCompiler, type GrammarSpec } from "../engine/grammar.js";
import type { ChatOutputSpec } from "./chat-output.js";
import { invalid } from "./errors.js";
import type { ChatRequest, CompletionRequest } from "./request-schema.js";

type Json = Record<string, unknown>;

/** The constraint, and the request field it came from (for errors). */
export interface StructuredOutput {
  spec: GrammarSpec;
  param: string;
}

const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

function schemaSpec(schema: unknown, param: string): GrammarSpec {
  if (typeof schema === "string") {
    try {
      schema = JSON.parse(schema);
    } catch {
      throw invalid(param, "must be a JSON schema (an object, or a string holding one)");
    }
  }
  if (typeof schema === "boolean") schema = schema ? {} : { not: {} };
  if (!isObject(schema)) throw invalid(param, "must be a JSON schema object");
  // Key order is kept: the output's properties follow the schema's order (so equal schemas in another order compile apart).
  return { type: "json_schema", schema: JSON.stringify(schema) };
}

function responseFormat(v: unknown): StructuredOutput | null {
  const param = "response_format";
  if (!isObject(v) || typeof v.type !== "string") throw invalid(param, "must be {type: \"text\" | \"json_object\" | \"json_schema\"}");
  if (v.type === "text") return null;
  if (v.type === "json_object") return { spec: { type: "json_object" }, param };
  if (v.type !== "json_schema") throw invalid("response_format.type", `"${v.type}" is not supported (text, json_object, json_schema)`);
  const js = v.json_schema;
  if (!isObject(js)) throw invalid("response_format.json_schema", "must be {name, schema, strict}");
  if (js.name !== undefined && typeof js.name !== "string") throw invalid("response_format.json_schema.name", "must be a string");
  if (js.strict !== undefined && js.strict !== null && typeof js.strict !== "boolean") throw invalid("response_format.json_schema.strict", "must be a boolean");
  // OpenAI allows the schema to be left out: any JSON object then.
  return { spec: js.schema === undefined ? { type: "json_object" } : schemaSpec(js.schema, "response_format.json_schema.schema"), param };
}

/** A literal in XGrammar's EBNF: a double-quoted string with escapes. */
function ebnfLiteral(s: string): string {
  return JSON.stringify(s);
}

function structuredOutputs(v: unknown): StructuredOutput | null {
  const param = "structured_outputs";
  if (!isObject(v)) throw invalid(param, "must be an object with one of json, regex, choice, grammar");
  const given = ["json", "regex", "choice", "grammar"].filter((k) => v[k] !== undefined && v[k] !== null);
  if (given.length === 0) return null;
  if (given.length > 1) throw invalid(param, `give only one of json, regex, choice, grammar (got ${given.join(", ")})`);
  if (v.json !== undefined && v.json !== null) return { spec: schemaSpec(v.json, "structured_outputs.json"), param };
  if (v.regex !== undefined && v.regex !== null) {
    if (typeof v.regex !== "string" || v.regex === "") throw invalid("structured_outputs.regex", "must be a non-empty string");
    return { spec: { type: "regex", pattern: v.regex }, param };
  }
  if (v.choice !== undefined && v.choice !== null) {
    const c = v.choice;
    if (!Array.isArray(c) || c.length === 0 || !c.every((x) => typeof x === "string" && x !== "")) {
      throw invalid("structured_outputs.choice", "must be a non-empty list of non-empty strings");
    }
    return { spec: { type: "ebnf", grammar: `root ::= ${(c as string[]).map(ebnfLiteral).join(" | ")}` }, param };
  }
  if (typeof v.grammar !== "string" || v.grammar === "") throw invalid("structured_outputs.grammar", "must be a non-empty EBNF string");
  return { spec: { type: "ebnf", grammar: v.grammar }, param };
}

/** The request's constraint, or null; at most one of response_format and structured_outputs. */
export function parseStructuredOutput(body: Json): StructuredOutput | null {
  const rf = body.response_format !== undefined && body.response_format !== null ? responseFormat(body.response_format) : null;
  const so = body.structured_outputs !== undefined && body.structured_outputs !== null ? structuredOutputs(body.structured_outputs) : null;
  if (rf && so) throw invalid("structured_outputs", "give either response_format or structured_outputs, not both");
  return rf ?? so;
}

/**
 * tool_choice "required": the answer is calls (one without parallel_tool_calls) to the tools;
 * a named function: one call to it (as vLLM's). Arguments follow the function's parameters.
 */
function toolCallOutput(r: ChatRequest, out: ChatOutputSpec | null): StructuredOutput | null {
  const choice = r.toolChoice;
  if (choice !== "required" && typeof choice !== "object") return null;
  if (!out?.tools) throw new Error("a required tool call without a tool-call parser"); // requestToolParser refuses such requests first
  const fns = r.tools
    .map((t) => t.function as Record<string, unknown>)
    .filter((f) => typeof choice !== "object" || f.name === choice.name)
    // No parameters: the function takes none.
    .map((f) => ({ name: String(f.name), parameters: JSON.stringify(f.parameters ?? { type: "object", properties: {} }) }));
  return { spec: { type: "composed", root: out.tools.parser.grammar(fns, typeof choice === "object" || !r.parallelToolCalls) }, param: "tools" };
}

/**
 * The constraint on a request's output, if any. A chat answer that may think
 * (the request set chat_template_kwargs.enable_thinking: true on a thinking
 * template) or must (the prompt opened a think block) gets one think block of
 * at most `maxThinkTokens` tokens before the constrained part.
 */
export function requestConstraint(r: ChatRequest | CompletionRequest, out: ChatOutputSpec | null, maxThinkTokens: number): StructuredOutput | null {
  if (r.kind === "completion") return r.structured;
  const base = r.structured ?? toolCallOutput(r, out);
  if (!base || !out?.reasoning) return base;
  const opened = out.reasoning.promptOpensThink;
  if (!opened && r.chatTemplateKwargs.enable_thinking !== true) return base;
  return { spec: { type: "think_then", maxTokens: maxThinkTokens, opened, then: base.spec }, param: base.param };
}

function compilerFor(model: LoadedModel, param: string): GrammarCompiler {
  if (!model.tokenizer) throw invalid(param, `model ${model.id} has no tokenizer, which constrained decoding needs`);
  const limits = model.engine.limits;
  return grammarCompiler(model.tokenizer, limits.vocabSize, limits.eosTokenIds);
}

/** Compiles the request's grammar (once per model and spec); a 400 naming the field when XGrammar refuses it. */
export async function compileStructured(s: StructuredOutput | null, model: LoadedModel): Promise<void> {
  if (!s) return;
  try {
    await compilerFor(model, s.param).compile(s.spec);
  } catch (e) {
    throw e instanceof GrammarError ? invalid(s.param, e.message) : e;
  }
}

/** The grammar compileStructured made for this request, or undefined when it has none. */
export function structuredGrammar(s: StructuredOutput | null, model: LoadedModel): Grammar | undefined {
  if (!s) return undefined;
  const g = compilerFor(model, s.param).ready(s.spec);
  if (!g) throw new Error("structured output used before compileStructured");
  return g;
}

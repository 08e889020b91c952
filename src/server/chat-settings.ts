/**
 * The server's chat settings (--chat-template, --reasoning-parser,
 * --tool-call-parser) applied to one chat request: what the template is
 * given, and how the output is parsed. Parsers not named by a flag are chosen
 * from the chat template, as the model's own format.
 */
import type { ChatRenderOptions, TextTokenizer } from "../model/tokenizer.js";
import type { ChatOutputSpec } from "./chat-output.js";
import { apiError } from "./errors.js";
import { templateThinks, THINK_START } from "./reasoning-parser.js";
import type { ChatRequest } from "./request-schema.js";
import { detectToolParser, TOOL_PARSER_NAMES, toolParser, type ToolParser, type ToolParserName } from "./tool-parsers.js";

export const REASONING_PARSERS = ["auto", "none", "qwen3", "deepseek_r1"] as const;
export type ReasoningParserName = (typeof REASONING_PARSERS)[number];
export const TOOL_CALL_PARSERS = ["auto", ...TOOL_PARSER_NAMES] as const;

export interface ChatSettings {
  /** Template text used instead of every model's own (--chat-template FILE); null: the model's. */
  chatTemplate: string | null;
  /** "auto" (default): think blocks are split off when the template thinks; "none": never; a name: always. */
  reasoningParser: ReasoningParserName;
  /** "auto" (default): the parser the template's tool format calls for. */
  toolCallParser: "auto" | ToolParserName;
  /** The most tokens a think block before a constrained answer may take; then the grammar closes it (--max-think-tokens). */
  maxThinkTokens: number;
}

export const DEFAULT_MAX_THINK_TOKENS = 4096;
export const DEFAULT_CHAT_SETTINGS: ChatSettings = { chatTemplate: null, reasoningParser: "auto", toolCallParser: "auto", maxThinkTokens: DEFAULT_MAX_THINK_TOKENS };

/** Are tools in play for this request (declared, and tool_choice is not "none")? */
const usesTools = (r: ChatRequest): boolean => r.tools.length > 0 && r.toolChoice !== "none";

function template(tok: TextTokenizer, s: ChatSettings): string {
  return s.chatTemplate ?? tok.chatTemplate ?? "";
}

/** What the chat template is given besides the messages; tool_choice "none" renders no tools, as vLLM does. */
export function renderOptions(r: ChatRequest, s: ChatSettings): ChatRenderOptions {
  return {
    ...(usesTools(r) ? { tools: r.tools } : {}),
    kwargs: r.chatTemplateKwargs,
    ...(s.chatTemplate !== null ? { template: s.chatTemplate } : {}),
  };
}

/** The tool-call parser for a request, or null without tools; a 400 when the template has no tool format and no parser is set. */
export function requestToolParser(r: ChatRequest, tok: TextTokenizer, s: ChatSettings, model: string): ToolParser | null {
  if (!usesTools(r)) return null;
  const parser = s.toolCallParser !== "auto" ? toolParser(s.toolCallParser) : detectToolParser(template(tok, s));
  if (!parser) {
    throw apiError("invalid_request", {
      param: "tools",
      detail: `model ${model}'s chat template has no tool-call format: serve it with --chat-template and --tool-call-parser to use tools`,
    });
  }
  return parser;
}

/** How the request's output is parsed into reasoning, content and tool calls. */
export function outputSpec(r: ChatRequest, tok: TextTokenizer, s: ChatSettings, promptIds: readonly number[], model: string): ChatOutputSpec {
  const parser = requestToolParser(r, tok, s, model);
  const thinks = s.reasoningParser === "auto" ? templateThinks(template(tok, s)) : s.reasoningParser !== "none";
  // Some templates open the think block in the prompt; the model then starts inside it.
  const promptOpensThink = thinks && tok.decode(promptIds.slice(-3), false).trimEnd().endsWith(THINK_START);
  return {
    reasoning: thinks ? { promptOpensThink } : null,
    tools: parser ? { parser, named: typeof r.toolChoice === "object" ? r.toolChoice.name : null, parallel: r.parallelToolCalls } : null,
  };
}

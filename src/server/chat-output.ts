/**
 * A chat choice's text → what the client sees: reasoning (think blocks),
 * content, and tool calls. Reasoning is split first, then the content is
 * searched for tool calls. While streaming, content is sent as it comes until
 * a tool call may begin; from there it is held until the end, parsed whole, and
 * sent as calls, or, if it does not parse, as the text it is. Streamed and
 * whole answers are therefore the same.
 */
import type { ParsedToolCall, ToolParser } from "./tool-parsers.js";
import { ThinkSplitter, type ReasoningSplit } from "./reasoning-parser.js";

export interface ToolCallPolicy {
  parser: ToolParser;
  /** tool_choice naming a function: only calls to it count. */
  named: string | null;
  /** parallel_tool_calls false: only the first call counts. */
  parallel: boolean;
}

/** How one request's chat output is parsed; null fields: that parser is off. */
export interface ChatOutputSpec {
  reasoning: { promptOpensThink: boolean } | null;
  tools: ToolCallPolicy | null;
}

export interface ToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

export interface ChatPiece extends ReasoningSplit {
  /** Only at the end. */
  toolCalls: ToolCall[];
}

/** Holds content from the first possible tool-call start until the end. */
class ToolGate {
  private held = "";
  private inCalls = false;

  constructor(private readonly policy: ToolCallPolicy) {}

  push(content: string): string {
    this.held += content;
    if (this.inCalls) return "";
    const start = this.policy.parser.findStart(this.held);
    if (start >= 0) {
      this.inCalls = true;
      const out = this.held.slice(0, start);
      this.held = this.held.slice(start);
      return out;
    }
    const keep = this.policy.parser.pending(this.held);
    const out = this.held.slice(0, this.held.length - keep);
    this.held = this.held.slice(this.held.length - keep);
    return out;
  }

  finish(): { content: string; calls: ParsedToolCall[] } {
    const region = this.held;
    this.held = "";
    const parsed = this.inCalls ? this.policy.parser.parse(region) : null;
    if (!parsed) return { content: region, calls: [] };
    const { named, parallel } = this.policy;
    // A call to another function than the one named is not the answer asked for: leave the text as it is.
    if (named !== null && parsed.calls.some((c) => c.name !== named)) return { content: region, calls: [] };
    return { content: parsed.text, calls: parallel ? parsed.calls : parsed.calls.slice(0, 1) };
  }
}

export class ChatOutput {
  private readonly think: ThinkSplitter | null;
  private readonly gate: ToolGate | null;

  constructor(private readonly spec: ChatOutputSpec) {
    this.think = spec.reasoning ? new ThinkSplitter(spec.reasoning.promptOpensThink) : null;
    this.gate = spec.tools ? new ToolGate(spec.tools) : null;
  }

  /** What of `text` can be sent now. */
  push(text: string): ChatPiece {
    const split = this.think ? this.think.push(text) : { reasoning: "", content: text };
    return { reasoning: split.reasoning, content: this.gate ? this.gate.push(split.content) : split.content, toolCalls: [] };
  }

  /** The rest, at the end of generation, with the tool calls. */
  finish(): ChatPiece {
    const split = this.think ? this.think.finish() : { reasoning: "", content: "" };
    if (!this.gate) return { ...split, toolCalls: [] };
    const content = this.gate.push(split.content);
    const end = this.gate.finish();
    const parser = this.spec.tools!.parser;
    const toolCalls = end.calls.map((c): ToolCall => ({ id: parser.newId(), type: "function", function: { name: c.name, arguments: c.arguments } }));
    return { reasoning: split.reasoning, content: content + end.content, toolCalls };
  }

  /** A whole output at once. */
  static parse(spec: ChatOutputSpec, text: string): ChatPiece {
    const out = new ChatOutput(spec);
    const first = out.push(text);
    const rest = out.finish();
    return { reasoning: first.reasoning + rest.reasoning, content: first.content + rest.content, toolCalls: rest.toolCalls };
  }
}

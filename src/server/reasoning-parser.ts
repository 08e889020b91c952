/**
 * Splits a thinking model's output into reasoning and answer, as vLLM's
 * qwen3 / deepseek_r1 reasoning parsers do: the text between `<think>` and
 * `</think>` is reasoning, the rest is content. Text is pushed as it is
 * generated; a possible tag prefix is held back until the next text decides it.
 * A think block that never closes (a max_tokens cut) is all reasoning, streamed
 * or not (vLLM returns it as content when not streamed; we keep both paths equal).
 */

export const THINK_START = "<think>";
export const THINK_END = "</think>";

export interface ReasoningSplit {
  reasoning: string;
  content: string;
}

/** Characters at the end of `text` that could begin `tag`. */
export function heldPrefix(text: string, tag: string): number {
  for (let n = Math.min(text.length, tag.length - 1); n > 0; n--) {
    if (tag.startsWith(text.slice(text.length - n))) return n;
  }
  return 0;
}

/** Does this chat template make the model think in `<think>` blocks (Qwen3, DeepSeek-R1)? */
export function templateThinks(template: string): boolean {
  return template.includes(THINK_START) && template.includes(THINK_END);
}

export class ThinkSplitter {
  private state: "start" | "thinking" | "answer";
  private held = "";

  /** `promptOpensThink`: the prompt itself ends inside an open `<think>` (templates that force thinking). */
  constructor(promptOpensThink = false) {
    this.state = promptOpensThink ? "thinking" : "start";
  }

  push(text: string): ReasoningSplit {
    const out: ReasoningSplit = { reasoning: "", content: "" };
    this.held += text;
    if (this.state === "start") {
      if (this.held.startsWith(THINK_START)) {
        this.held = this.held.slice(THINK_START.length);
        this.state = "thinking";
      } else if (THINK_START.startsWith(this.held)) {
        return out; // still undecided
      } else {
        this.state = "answer";
      }
    }
    if (this.state === "thinking") {
      const end = this.held.indexOf(THINK_END);
      if (end < 0) {
        const keep = heldPrefix(this.held, THINK_END);
        out.reasoning = this.held.slice(0, this.held.length - keep);
        this.held = this.held.slice(this.held.length - keep);
        return out;
      }
      out.reasoning = this.held.slice(0, end);
      this.held = this.held.slice(end + THINK_END.length);
      this.state = "answer";
    }
    out.content = this.held;
    this.held = "";
    return out;
  }

  /** The held-back text, at the end of generation. */
  finish(): ReasoningSplit {
    const rest = this.held;
    this.held = "";
    return this.state === "thinking" ? { reasoning: rest, content: "" } : { reasoning: "", content: rest };
  }
}

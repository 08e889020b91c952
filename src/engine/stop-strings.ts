/**
 * Stop strings, found across token boundaries. Text that could be the start
 * of a stop string is held back until it is known not to be one, and a
 * matched stop string is emitted only when `include` is set.
 */
export class StopStringMatcher {
  private text = "";
  private sent = 0;
  private readonly holdBack: number;

  constructor(
    private readonly stops: readonly string[],
    private readonly include = false,
  ) {
    this.holdBack = Math.max(0, ...stops.map((s) => s.length - 1));
  }

  /**
   * Adds decoded text; returns what can be emitted now and the stop string that ended generation, if one
   * did. While `active` is false (min_tokens not reached, as vLLM does) no stop string is looked for.
   */
  push(delta: string, active = true): { text: string; stopped: string | null } {
    const from = Math.max(0, this.sent - this.holdBack);
    this.text += delta;
    if (!active) return { text: this.take(this.text.length - this.holdBack), stopped: null }; // before min_tokens: no stop yet
    let cut = -1;
    let matched: string | null = null;
    for (const s of this.stops) {
      const i = this.text.indexOf(s, from);
      if (i >= 0 && (cut < 0 || i < cut)) [cut, matched] = [i, s];
    }
    if (matched !== null) {
      this.text = this.text.slice(0, cut + (this.include ? matched.length : 0));
      return { text: this.take(this.text.length), stopped: matched };
    }
    return { text: this.take(this.text.length - this.holdBack), stopped: null };
  }

  /** Everything not yet emitted (generation ended for another reason). */
  flush(): string {
    return this.take(this.text.length);
  }

  private take(upTo: number): string {
    const code = this.text.charCodeAt(upTo - 1);
    if (upTo < this.text.length && code >= 0xd800 && code <= 0xdbff) upTo--; // never split a surrogate pair
    if (upTo <= this.sent) return "";
    const out = this.text.slice(this.sent, upTo);
    this.sent = upTo;
    return out;
  }
}

/**
 * Runs batches inside the server. Each batch is validated, then its lines are
 * fed to the engines at LOW priority with the batch's tenant, at most
 * MAX_IN_FLIGHT at a time, read from the input file as they go; each finished
 * line is committed with its counter (BatchStore.recordResults). A line that
 * ends because the server stops (or fails while it stops) is not recorded, so it
 * runs again after a restart: at start every unfinished batch resumes from its recorded lines.
 * Finalization writes the output and error files from the database; lines a
 * cancel or the completion window cut off go to the error file.
 */
import { randomBytes } from "node:crypto";
import { setMaxListeners } from "node:events";
import type { Logger } from "pino";
import type { EngineManager } from "../engine/engine-manager.js";
import { Priority } from "../engine/request.js";
import { runCompletion } from "../server/completion-runner.js";
import type { UsageSink } from "../server/generation.js";
import type { ChatSettings } from "../server/chat-settings.js";
import type { BatchRecord, BatchStore, LineResult } from "../store/batch-store.js";
import { BATCH_ENDPOINTS, parseLine, problem, readLines, validateInput, type BatchEndpoint, type InputLine } from "./batch-input.js";
import type { FileStorage } from "./file-storage.js";

/** Lines of one batch in the engines at once. */
export const MAX_IN_FLIGHT = 32;
/** How often running batches are checked for a cancel from another process (`weft batches cancel`) and for expiry. */
const POLL_MS = 1000;

type Ending = "completed" | "cancelled" | "expired";
const CUT_OFF = {
  cancelled: { code: "batch_cancelled", message: "This request was not executed because the batch was cancelled." },
  expired: { code: "batch_expired", message: "This request could not be executed before the completion window expired." },
  completed: { code: "batch_failed", message: "This request has no recorded result." },
} as const;

export interface BatchRunnerDeps {
  manager: EngineManager;
  store: BatchStore;
  files: FileStorage;
  usage: UsageSink | null;
  log: Logger;
  chat: ChatSettings;
}

export class BatchRunner {
  private readonly jobs = new Map<string, BatchJob>();
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;

  constructor(private readonly d: BatchRunnerDeps) {}

  /** Resumes every unfinished batch and starts watching for cancels and expiry. */
  start(): void {
    for (const id of this.d.store.activeBatchIds()) this.run(id);
    this.timer = setInterval(() => this.poll(), POLL_MS);
    this.timer.unref();
  }

  /** Starts a batch just created. */
  run(id: string): void {
    if (this.stopped || this.jobs.has(id)) return;
    const job = new BatchJob(id, this.d);
    this.jobs.set(id, job);
    job.done = job.run().catch((e: unknown) => this.d.log.error({ batch: id, err: e instanceof Error ? e.stack : String(e) }, "batch runner fault"))
      .finally(() => this.jobs.delete(id));
  }

  /** Stops the lines of a batch already moved to `cancelling`. */
  cancelled(id: string): void {
    this.jobs.get(id)?.end("cancelled");
  }

  /** Feeds no more lines; what is in flight ends with the engines (and runs again after a restart). */
  stop(): void {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
    for (const job of this.jobs.values()) job.halt();
  }

  /** After stop and the engines' shutdown: waits for the jobs to settle. */
  async closed(): Promise<void> {
    await Promise.all([...this.jobs.values()].map((j) => j.done));
  }

  private poll(): void {
    for (const [id, job] of this.jobs) {
      try {
        const b = this.d.store.batch(id, null);
        if (b?.status === "cancelling") job.end("cancelled");
        else if (b && b.expiresAt <= Date.now() / 1000) job.end("expired");
      } catch (e) {
        this.d.log.warn({ batch: id, err: String(e) }, "batch status check failed; retrying");
      }
    }
  }
}

class BatchJob {
  done: Promise<void> = Promise.resolve();
  private ending: Ending | null = null;
  private halted = false;
  private readonly abort = new AbortController();

  constructor(
    readonly id: string,
    private readonly d: BatchRunnerDeps,
  ) {
    // Every line in flight listens on the batch's one signal (its encoding, then its engine requests).
    setMaxListeners(MAX_IN_FLIGHT * 2 + 1, this.abort.signal);
  }

  /** Ends the batch early: lines in flight are aborted and cut off with the rest. */
  end(how: Exclude<Ending, "completed">): void {
    this.ending ??= how;
    this.abort.abort();
  }

  halt(): void {
    this.halted = true;
  }

  async run(): Promise<void> {
    let b = this.batch();
    if (b.status === "validating" && !(await this.validate(b))) return;
    b = this.batch();
    if (b.expiresAt <= Date.now() / 1000 && b.status === "in_progress") this.end("expired");
    if (b.status === "in_progress") await this.execute(b);
    if (this.halted) return;
    b = this.batch();
    if (b.status === "cancelling") this.ending = "cancelled";
    await this.finalize(this.batch(), this.ending ?? "completed");
  }

  private batch(): BatchRecord {
    const b = this.d.store.batch(this.id, null);
    if (!b) throw new Error(`batch ${this.id} vanished from the database`);
    return b;
  }

  /** Checks the input file; false when the batch failed (or was cancelled meanwhile). */
  private async validate(b: BatchRecord): Promise<boolean> {
    const input = this.inputPath(b);
    const result = input ? await validateInput(input, b.endpoint as BatchEndpoint, (m) => this.d.manager.has(m)) : { problems: [problem("input_file_missing")] };
    // A batch cancelled while it was checked is not failed: it goes on to end as cancelled.
    if ("problems" in result) return !this.d.store.transition(b.id, ["validating"], "failed", { errors: result.problems });
    return this.d.store.transition(b.id, ["validating"], "in_progress", { total: result.total }) || this.batch().status === "cancelling";
  }

  private inputPath(b: BatchRecord): string | null {
    const f = this.d.store.file(b.inputFileId, null);
    return f ? this.d.files.pathOf(f) : null;
  }

  private stopping(): boolean {
    return this.halted || this.ending !== null;
  }

  /** Feeds the lines not yet recorded, MAX_IN_FLIGHT at a time, until all are done or the batch ends early. */
  private async execute(b: BatchRecord): Promise<void> {
    const input = this.inputPath(b);
    if (!input) return;
    const done = this.d.store.doneLines(b.id);
    const inFlight = new Set<Promise<void>>();
    for await (const { line, text } of readLines(input)) {
      if (done.has(line)) continue;
      while (inFlight.size >= MAX_IN_FLIGHT && !this.stopping()) await Promise.race(inFlight);
      if (this.stopping()) break;
      const p: Promise<void> = this.runLine(b, parseLine(line, text)).finally(() => inFlight.delete(p));
      inFlight.add(p);
    }
    await Promise.all(inFlight);
  }

  private async runLine(b: BatchRecord, l: InputLine): Promise<void> {
    const hex = randomBytes(12).toString("hex"), requestId = `req-${hex}`;
    const res = await runCompletion(this.d.manager, {
      kind: BATCH_ENDPOINTS[b.endpoint as BatchEndpoint], body: l.body, requestId, tenant: b.tenant, priority: Priority.LOW, signal: this.abort.signal, chat: this.d.chat,
    }, { requestId, logFault: (f, m) => this.d.log.error(f, m) });
    if (res.kind !== "response") return; // shut down or cut off: not a result
    if (this.halted && res.statusCode !== 200) return; // may be the shutdown's doing (a closed tokenizer pool): run it again after restart
    const data = { id: `batch_req_${hex}`, custom_id: l.customId, response: { status_code: res.statusCode, request_id: requestId, body: res.body }, error: null };
    this.record([{ line: l.line, ok: res.statusCode === 200, data: JSON.stringify(data) }]);
    if (b.keyName && res.usage && this.d.usage) this.d.usage.record(b.keyName, res.usage.promptTokens, res.usage.completionTokens);
  }

  private record(rs: LineResult[]): void {
    try {
      this.d.store.recordResults(this.id, rs);
    } catch (e) {
      // Unrecorded, the lines count as not run: they go to the error file at finalization.
      this.d.log.error({ batch: this.id, lines: rs.map((r) => r.line), err: String(e) }, "batch result not recorded");
    }
  }

  /** Cuts off the lines without a result, writes the output and error files, and sets the final status. */
  private async finalize(b: BatchRecord, how: Ending): Promise<void> {
    if (how === "completed") this.d.store.transition(b.id, ["in_progress"], "finalizing");
    const input = this.inputPath(b);
    if (input) {
      const done = this.d.store.doneLines(b.id), cut: LineResult[] = [];
      for await (const { line, text } of readLines(input)) {
        const l = done.has(line) ? null : tryParseLine(line, text);
        if (l) cut.push({ line, ok: false, data: JSON.stringify({ id: `batch_req_${randomBytes(12).toString("hex")}`, custom_id: l.customId, response: null, error: CUT_OFF[how] }) });
      }
      this.d.store.recordResults(b.id, cut);
    }
    const output = this.d.files.writeLines(b, "batch_output", this.d.store.results(b.id, true));
    const error = this.d.files.writeLines(b, "batch_error", this.d.store.results(b.id, false));
    this.d.store.finish(b.id, how, { output, error });
    this.d.log.info({ batch: b.id, tenant: b.tenant, status: how, output_file_id: output?.id ?? null, error_file_id: error?.id ?? null }, "batch ended");
  }
}

/** A line of a batch cancelled before its check: it may not parse, and then it has no custom_id to report. */
function tryParseLine(line: number, text: string): InputLine | null {
  try {
    return parseLine(line, text);
  } catch {
    return null;
  }
}

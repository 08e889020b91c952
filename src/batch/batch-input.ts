/**
 * A batch's input file: read line by line (never whole), and checked the way
 * OpenAI checks it before running anything. Problems with the file as a whole
 * (a line that is not JSON, a missing or repeated custom_id, a url or method
 * that is not the batch's, an unknown model) fail the batch with `errors`; a
 * bad request body is only found when the line runs, and goes to the error
 * file with the 400 the HTTP route would have answered.
 */
import fs from "node:fs";
import readline from "node:readline";
import type { BatchProblem } from "../store/batch-store.js";

/** The endpoints a batch may target, and the request kind each runs. */
export const BATCH_ENDPOINTS = { "/v1/chat/completions": "chat", "/v1/completions": "completion" } as const;
export type BatchEndpoint = keyof typeof BATCH_ENDPOINTS;

/** OpenAI's limit on requests per batch. */
export const MAX_BATCH_LINES = 50_000;
/** Problems listed per failed batch; a last `more_errors` entry says when there were more. */
const MAX_PROBLEMS = 100;

/** Every whole-file problem, with its message: the batch `errors` catalogue. */
const PROBLEMS = {
  empty_file: "The input file has no requests.",
  too_many_requests: `The input file has more than ${MAX_BATCH_LINES} requests.`,
  invalid_json_line: "This line is not parseable as valid JSON.",
  invalid_request: "Each line must be a JSON object with custom_id, method, url and body.",
  missing_custom_id: "This line has no custom_id (a non-empty string).",
  duplicate_custom_id: "The custom_id for this request is a duplicate of another request. The custom_id parameter must be unique for each request in a batch.",
  invalid_method: "The method must be POST.",
  invalid_url: "The URL provided for this request does not match the batch endpoint.",
  invalid_body: "The body must be a JSON object with a model.",
  model_not_found: "The model for this request does not exist.",
  input_file_missing: "The batch's input file no longer exists.",
  more_errors: "More lines have problems; only the first ones are listed.",
} as const;
export type ProblemCode = keyof typeof PROBLEMS;

export function problem(code: ProblemCode, line: number | null = null, param: string | null = null): BatchProblem {
  return { code, message: PROBLEMS[code], param, line };
}

/** One request line: its 1-based line number in the file, and the parsed line. */
export interface InputLine {
  line: number;
  customId: string;
  body: Record<string, unknown>;
}

/** The file's non-blank lines with their 1-based line numbers. */
export async function* readLines(file: string): AsyncGenerator<{ line: number; text: string }> {
  const rl = readline.createInterface({ input: fs.createReadStream(file, { encoding: "utf8" }), crlfDelay: Infinity });
  let line = 0;
  try {
    for await (const text of rl) {
      line++;
      if (text.trim() !== "") yield { line, text };
    }
  } finally {
    rl.close();
  }
}

/** A line already validated (the file does not change after upload). */
export function parseLine(line: number, text: string): InputLine {
  const o = JSON.parse(text) as { custom_id: string; body: Record<string, unknown> };
  return { line, customId: o.custom_id, body: o.body };
}

/** The number of requests in the file, or the problems that fail the batch. */
export async function validateInput(file: string, endpoint: BatchEndpoint, hasModel: (id: string) => boolean): Promise<{ total: number } | { problems: BatchProblem[] }> {
  const problems: BatchProblem[] = [];
  const ids = new Set<string>();
  let total = 0, unlisted = 0;
  for await (const { line, text } of readLines(file)) {
    total++;
    const p = lineProblem(line, text, endpoint, hasModel, ids);
    if (p && problems.length < MAX_PROBLEMS) problems.push(p);
    else if (p) unlisted++;
  }
  if (total === 0) problems.push(problem("empty_file"));
  if (total > MAX_BATCH_LINES) problems.push(problem("too_many_requests"));
  if (unlisted > 0) problems.push(problem("more_errors"));
  return problems.length ? { problems } : { total };
}

function lineProblem(line: number, text: string, endpoint: BatchEndpoint, hasModel: (id: string) => boolean, ids: Set<string>): BatchProblem | null {
  let o: unknown;
  try {
    o = JSON.parse(text);
  } catch {
    return problem("invalid_json_line", line);
  }
  if (typeof o !== "object" || o === null || Array.isArray(o)) return problem("invalid_request", line);
  const r = o as Record<string, unknown>;
  if (typeof r.custom_id !== "string" || r.custom_id === "") return problem("missing_custom_id", line, "custom_id");
  if (ids.has(r.custom_id)) return problem("duplicate_custom_id", line, "custom_id");
  ids.add(r.custom_id);
  if (r.method !== "POST") return problem("invalid_method", line, "method");
  if (r.url !== endpoint) return problem("invalid_url", line, "url");
  const body = r.body as Record<string, unknown> | null;
  if (typeof body !== "object" || body === null || Array.isArray(body) || typeof body.model !== "string") return problem("invalid_body", line, "body");
  if (!hasModel(body.model)) return problem("model_not_found", line, "body.model");
  return null;
}

/**
 * Every error a client can see, in one catalogue: code, HTTP status, OpenAI
 * error type, message template and Retry-After. Responses use OpenAI's shape:
 * {"error": {message, type, param, code}}. `toApiError` is the one mapping from
 * anything thrown (our errors, the engine's, fastify's) to a catalogue entry.
 */
import type { FastifyError } from "fastify";
import { EngineError } from "../engine/errors.js";

interface Entry {
  status: number;
  type: string;
  /** `{name}` placeholders are filled from the throw site's values. */
  message: string;
  /** Seconds a client should wait before retrying (429 / 503). */
  retryAfter?: number;
}

export const ERRORS = {
  invalid_request: { status: 400, type: "invalid_request_error", message: "{param}: {detail}" },
  context_length_exceeded: { status: 400, type: "invalid_request_error", message: "{detail}" },
  unsupported_content: { status: 400, type: "invalid_request_error", message: "{param}: {detail}" },
  invalid_json: { status: 400, type: "invalid_request_error", message: "The request body is not valid JSON: {detail}" },
  bad_request: { status: 400, type: "invalid_request_error", message: "Malformed HTTP request: {detail}" },
  invalid_api_key: { status: 401, type: "authentication_error", message: "{detail}" },
  origin_not_allowed: { status: 403, type: "permission_error", message: "Cross-origin requests from {origin} are not allowed." },
  host_not_allowed: { status: 403, type: "permission_error", message: "Requests for host '{host}' are not allowed (DNS-rebinding protection; see --allowed-hosts)." },
  model_not_found: { status: 404, type: "invalid_request_error", message: "The model '{model}' does not exist." },
  not_found: { status: 404, type: "invalid_request_error", message: "No route for {method} {path}." },
  file_not_found: { status: 404, type: "invalid_request_error", message: "No such File object: {id}" },
  batch_not_found: { status: 404, type: "invalid_request_error", message: "No batch found with id '{id}'." },
  batch_not_cancellable: { status: 409, type: "invalid_request_error", message: "Cannot cancel a batch with status '{status}'." },
  file_in_use: { status: 409, type: "invalid_request_error", message: "The file {id} is the input of an unfinished batch; delete it once the batch ends." },
  file_too_large: { status: 413, type: "invalid_request_error", message: "The file is larger than {limit} bytes (--max-batch-file-bytes)." },
  method_not_allowed: { status: 405, type: "invalid_request_error", message: "{detail}" },
  request_timeout: { status: 408, type: "invalid_request_error", message: "The request did not arrive in time." },
  body_too_large: { status: 413, type: "invalid_request_error", message: "The request body is too large." },
  unsupported_media_type: { status: 415, type: "invalid_request_error", message: "Send the body as application/json." },
  headers_too_large: { status: 431, type: "invalid_request_error", message: "The request headers are too large." },
  queue_full: { status: 429, type: "rate_limit_error", message: "{detail}", retryAfter: 1 },
  rate_limit_exceeded: { status: 429, type: "rate_limit_error", message: "Rate limit reached for this API key: {detail}.", retryAfter: 1 },
  model_load_failed: { status: 503, type: "service_unavailable", message: "The model '{model}' could not be loaded (request {requestId}); the server log says why.", retryAfter: 30 },
  too_many_connections: { status: 503, type: "service_unavailable", message: "The server is at its connection limit; retry shortly.", retryAfter: 1 },
  shutting_down: { status: 503, type: "service_unavailable", message: "The server is shutting down.", retryAfter: 5 },
  generation_failed: { status: 500, type: "server_error", message: "Generation failed (request {requestId})." },
  internal_error: { status: 500, type: "server_error", message: "Internal server error (request {requestId})." },
} as const satisfies Record<string, Entry>;

export type ErrorCode = keyof typeof ERRORS;

/** The placeholder names of a template, as a union of string literals. */
type Placeholders<S extends string> = S extends `${string}{${infer K}}${infer Rest}` ? K | Placeholders<Rest> : never;
export type ErrorVars<C extends ErrorCode> = Record<Placeholders<(typeof ERRORS)[C]["message"]>, string | number>;

export interface OpenAIErrorBody {
  error: { message: string; type: string; param: string | null; code: string };
}

export class ApiError extends Error {
  readonly status: number;
  readonly type: string;
  readonly retryAfter: number | undefined;

  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly param: string | null = null,
    /** Seconds, for 429 / 503; defaults to the catalogue's. */
    retryAfter?: number,
  ) {
    super(message);
    const e: Entry = ERRORS[code];
    this.status = e.status;
    this.type = e.type;
    this.retryAfter = retryAfter ?? e.retryAfter;
  }

  body(): OpenAIErrorBody {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

/** The catalogue's error `code`, its template filled from `vars`. */
export function apiError<C extends ErrorCode>(code: C, vars: ErrorVars<C>, options: { param?: string | null; retryAfter?: number | undefined } = {}): ApiError {
  const values = vars as Record<string, string | number>;
  const message = ERRORS[code].message.replace(/\{(\w+)\}/g, (_, k: string) => String(values[k]));
  return new ApiError(code, message, options.param ?? ("param" in values ? String(values.param) : null), options.retryAfter);
}

/** A 400 naming the offending field. */
export function invalid(param: string, detail: string): ApiError {
  return apiError("invalid_request", { param, detail });
}

/** Where an error happened, for the log line of a fault. */
export interface ErrorContext {
  requestId: string;
  logFault: (fields: Record<string, unknown>, msg: string) => void;
}

/** Anything thrown → the catalogue. Faults are logged with the request id; the client sees only the id. */
export function toApiError(err: unknown, ctx: ErrorContext): ApiError {
  if (err instanceof ApiError) return err;
  if (err instanceof EngineError) return fromEngine(err, ctx.requestId);
  const fastify = fromFastify(err as FastifyError);
  if (fastify) return fastify;
  const e = err instanceof Error ? err : new Error(String(err));
  ctx.logFault({ id: ctx.requestId, err: { message: e.message, stack: e.stack } }, "internal error");
  return apiError("internal_error", { requestId: ctx.requestId });
}

function fromEngine(e: EngineError, requestId: string): ApiError {
  const model = e.model ?? "";
  switch (e.code) {
    case "model_not_found": return apiError("model_not_found", { model }, { param: "model" });
    case "model_load_failed": return apiError("model_load_failed", { model, requestId }, { retryAfter: e.retryAfter });
    case "invalid_request": return new ApiError("invalid_request", e.param ? `${e.param}: ${e.message}` : e.message, e.param);
    case "context_length_exceeded": return new ApiError("context_length_exceeded", e.message, e.param);
    case "queue_full": return new ApiError("queue_full", e.message, null, e.retryAfter);
    case "shutting_down": return apiError("shutting_down", {});
  }
}

function fromFastify(err: FastifyError): ApiError | null {
  switch (err.code) {
    case "FST_ERR_CTP_BODY_TOO_LARGE": return apiError("body_too_large", {});
    case "FST_ERR_CTP_INVALID_MEDIA_TYPE": return apiError("unsupported_media_type", {});
    case "FST_ERR_CTP_EMPTY_JSON_BODY": return apiError("invalid_json", { detail: "the body is empty" });
    case "FST_ERR_CTP_INVALID_CONTENT_LENGTH": return apiError("bad_request", { detail: "the Content-Length header does not match the body" });
    case "FST_ERR_CTP_INVALID_JSON_BODY": return apiError("invalid_json", { detail: err.message });
  }
  if (err instanceof SyntaxError) return apiError("invalid_json", { detail: err.message });
  if (err.statusCode === 413) return apiError("body_too_large", {});
  if (err.statusCode === 415) return apiError("unsupported_media_type", {});
  if (err.statusCode === 408) return apiError("request_timeout", {});
  if (err.statusCode === 405) return apiError("method_not_allowed", { detail: err.message });
  if (err.statusCode !== undefined && err.statusCode >= 400 && err.statusCode < 500) return apiError("bad_request", { detail: err.message });
  return null;
}

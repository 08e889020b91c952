/** Errors the engine raises at admission; the server maps each code to an HTTP status (src/server/errors.ts). */
export type EngineErrorCode = "invalid_request" | "context_length_exceeded" | "queue_full" | "shutting_down" | "model_not_found" | "model_load_failed";

export class EngineError extends Error {
  constructor(
    readonly code: EngineErrorCode,
    message: string,
    /** The request field at fault, when there is one. */
    readonly param: string | null = null,
    /** Seconds to wait before retrying, when the refusal is temporary. */
    readonly retryAfter?: number,
    /** The model concerned (model_not_found, model_load_failed). */
    readonly model?: string,
  ) {
    super(message);
    this.name = "EngineError";
  }
}

/** Errors the engine raises at admission; the server maps each code to an HTTP status. */
export type EngineErrorCode = "invalid_request" | "context_length_exceeded" | "queue_full" | "shutting_down";

export class EngineError extends Error {
  constructor(
    readonly code: EngineErrorCode,
    message: string,
    /** The request field at fault, when there is one. */
    readonly param: string | null = null,
  ) {
    super(message);
    this.name = "EngineError";
  }
}

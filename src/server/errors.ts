/**
 * Every error a client can see, in one catalogue: code, OpenAI error type,
 * HTTP status. Responses use OpenAI's shape: {"error": {message, type, param, code}}.
 */
export const ERRORS = {
  invalid_request: { status: 400, type: "invalid_request_error" },
  context_length_exceeded: { status: 400, type: "invalid_request_error" },
  unsupported_content: { status: 400, type: "invalid_request_error" },
  invalid_json: { status: 400, type: "invalid_request_error" },
  invalid_api_key: { status: 401, type: "authentication_error" },
  model_not_found: { status: 404, type: "invalid_request_error" },
  not_found: { status: 404, type: "invalid_request_error" },
  method_not_allowed: { status: 405, type: "invalid_request_error" },
  body_too_large: { status: 413, type: "invalid_request_error" },
  unsupported_media_type: { status: 415, type: "invalid_request_error" },
  queue_full: { status: 429, type: "rate_limit_error" },
  rate_limit_exceeded: { status: 429, type: "rate_limit_error" },
  shutting_down: { status: 503, type: "service_unavailable" },
  model_load_failed: { status: 500, type: "server_error" },
  internal_error: { status: 500, type: "server_error" },
} as const;

export type ErrorCode = keyof typeof ERRORS;

export interface OpenAIErrorBody {
  error: { message: string; type: string; param: string | null; code: string };
}

export class ApiError extends Error {
  readonly status: number;
  readonly type: string;

  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly param: string | null = null,
    /** Seconds, for 429 / 503. */
    readonly retryAfter?: number,
  ) {
    super(message);
    this.status = ERRORS[code].status;
    this.type = ERRORS[code].type;
  }

  body(): OpenAIErrorBody {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

/** A 400 naming the offending field. */
export function invalid(param: string, message: string): ApiError {
  return new ApiError("invalid_request", `${param}: ${message}`, param);
}

/** A checkpoint that cannot be loaded; the message names the file and, where there is one, the tensor. */
export class CheckpointError extends Error {
  constructor(
    readonly file: string,
    message: string,
    readonly tensor?: string,
  ) {
    super(`${file}${tensor ? ` (tensor ${tensor})` : ""}: ${message}`);
    this.name = "CheckpointError";
  }
}

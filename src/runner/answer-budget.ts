// The memory answers take while they arrive. Each request's answer is cut at its own bound (what
// the request could produce, answerByteLimit), and all answers in flight share one budget
// (REGEN_ANSWER_BUFFER_BYTES): a server that streams without end, on every request at once, cannot
// run the process out of memory.
//
// Over the budget, the answer holding the most is cut, not the one whose bytes happened to arrive
// last, and nothing is throttled: throttling would only keep its bytes and its slot until its
// timeout, while the answers behind it waited. That cut is regen's own limit, not the server's
// fault: the largest answer in flight may well be a healthy long one, so its sample is given back
// unspent (AnswerShed), and only an answer past its own bound is the server's (answer_too_large).

/**
 * An answer regen stopped reading, from a server that answered 200: larger than its request
 * allows, or not the JSON or event stream a 200 must be. The server's fault, but not its
 * connection's: the endpoint's health is untouched.
 */
export class AnswerRefused extends Error {
  constructor(
    readonly code: 'answer_too_large' | 'malformed_response',
    message: string,
  ) {
    super(message);
  }
}

/** An answer cut because the answers in flight passed regen's memory budget: its sample is given back, nothing charged. */
export class AnswerShed extends Error {}

/** Why a lease's answer was cut. */
export type AnswerCut = AnswerRefused | AnswerShed;

/** A held streamed piece of text costs its V8 string header and its slot in the array that holds it, besides two bytes a character. */
const HELD_STRING_OVERHEAD_BYTES = 32;

/** What a piece of streamed text costs while it is held. */
export function heldTextBytes(piece: string): number {
  return piece === '' ? 0 : 2 * piece.length + HELD_STRING_OVERHEAD_BYTES;
}

export class AnswerBudget {
  private held = 0;
  private readonly leases = new Set<AnswerLease>();

  constructor(readonly totalBytes: number) {}

  /** Bytes held by the answers in flight. */
  get heldBytes(): number {
    return this.held;
  }

  /** A lease for one request's answer, which may hold up to `limitBytes`; release it when the request has settled. */
  lease(limitBytes: number): AnswerLease {
    const lease = new AnswerLease(this, limitBytes);
    this.leases.add(lease);
    return lease;
  }

  /** @internal the lease's side of the accounting. */
  moved(lease: AnswerLease, bytes: number): void {
    this.held += bytes;
    if (bytes < 0) return;
    while (this.held > this.totalBytes) {
      let largest = lease;
      for (const l of this.leases) if (l.bytes > largest.bytes) largest = l;
      if (largest.bytes === 0) return;
      largest.cutWith(
        new AnswerShed(`the answers in flight passed their memory budget of ${this.totalBytes} bytes, this one holding the most (${largest.bytes} bytes)`),
      );
    }
  }

  /** @internal */
  closed(lease: AnswerLease): void {
    this.leases.delete(lease);
  }
}

/** One request's share of the budget. The reader takes bytes as it holds them, gives them back as it lets them go. */
export class AnswerLease {
  bytes = 0;
  /** Why the answer was cut, once it was. */
  refused: AnswerCut | null = null;
  private cut: ((err: AnswerCut) => void) | null = null;

  constructor(
    private readonly budget: AnswerBudget,
    readonly limitBytes: number,
  ) {}

  /** Where a cut lands: the reader stops reading and fails its request with the error. */
  onCut(cut: (err: AnswerCut) => void): void {
    this.cut = cut;
  }

  /** `bytes` more are held. False when the answer was cut, by its own bound or the budget (the cut has then run). */
  take(bytes: number): boolean {
    if (this.refused) return false;
    if (this.bytes + bytes > this.limitBytes) {
      this.cutWith(new AnswerRefused('answer_too_large', `the answer passed ${this.limitBytes} bytes, more than its request can produce`));
      return false;
    }
    this.bytes += bytes;
    this.budget.moved(this, bytes);
    return this.refused === null;
  }

  give(bytes: number): void {
    if (this.refused) return;
    this.bytes -= bytes;
    this.budget.moved(this, -bytes);
  }

  /** Everything held is given back and the lease is done. */
  release(): void {
    this.budget.moved(this, -this.bytes);
    this.bytes = 0;
    this.budget.closed(this);
  }

  /** @internal cuts the answer: its bytes are given back and its reader told. */
  cutWith(why: AnswerCut): void {
    if (this.refused) return;
    this.refused = why;
    this.release();
    this.cut?.(this.refused);
  }
}

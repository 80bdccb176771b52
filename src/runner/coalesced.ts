/**
 * Runs an async job so that two runs never overlap. Asked for while a run is under way, the job
 * runs once more after it, however many times it was asked meanwhile; each caller's promise
 * settles when a run that started after the call has ended.
 */
export class Coalesced {
  private running: Promise<void> | null = null;
  private next: Promise<void> | null = null;

  run(job: () => Promise<void>): Promise<void> {
    if (!this.running) {
      this.running = job().finally(() => {
        this.running = null;
      });
      return this.running;
    }
    this.next ??= this.running
      .catch(() => {})
      .then(() => {
        this.next = null;
        return this.run(job);
      });
    return this.next;
  }
}

import { ConfigError, loadConfig, type Config } from '../config.js';
import { PortInUseError, startServer, type Server } from '../server.js';
import { RunnerLockedError } from '../runner/lock.js';
import type { RunnerThread } from '../runner/thread.js';
import { SecretKeyError } from '../db/secrets.js';

export interface ServeFlags {
  port?: string;
  host?: string;
  data?: string;
  logLevel?: string;
  outputUri?: string;
  inputRoots?: string;
}

/** `regen serve`: the API and the runner in one process, until SIGTERM or SIGINT. */
export async function serveCommand(flags: ServeFlags, runnerThread?: RunnerThread): Promise<Server> {
  let config: Config;
  try {
    config = loadConfig(process.env, {
      port: flags.port,
      host: flags.host,
      data: flags.data,
      'log-level': flags.logLevel,
      'output-uri': flags.outputUri,
      'input-roots': flags.inputRoots,
    });
  } catch (err) {
    if (err instanceof ConfigError) {
      for (const line of err.message.split('\n')) process.stderr.write(`regen: ${line}\n`);
      process.exit(2);
    }
    throw err;
  }
  let server: Server;
  try {
    server = await startServer(config, {
      runnerThread,
      // The same line as a start refused for its key: the replicas that have it carry on.
      onLockedOut: (err) => {
        process.stderr.write(`regen: ${err.message}\n`);
        process.exit(2);
      },
    });
  } catch (err) {
    if (
      err instanceof RunnerLockedError ||
      err instanceof PortInUseError ||
      err instanceof SecretKeyError ||
      /refusing to listen/.test((err as Error).message)
    ) {
      process.stderr.write(`regen: ${(err as Error).message}\n`);
      process.exit(2);
    }
    throw err;
  }
  installSignals(server);
  // State lives in the database, so one stray rejection is logged rather than allowed to stop
  // dispatch for the whole fleet.
  process.on('unhandledRejection', (err) => {
    server.deps.logger.error({ err: { message: (err as Error)?.message, stack: (err as Error)?.stack } }, 'unhandled rejection');
  });
  return server;
}

/** First signal: drain for the grace period, then exit. Second: commit what is known and exit now. */
export function installSignals(server: Server, beforeExit: () => Promise<void> = async () => {}): void {
  let signalled = false;
  const onSignal = (sig: NodeJS.Signals) => {
    if (signalled) {
      server.deps.logger.warn({ signal: sig }, 'second signal: exiting now; unfinished leases return to the queue on restart');
      void Promise.resolve(server.runner?.flushNow()).finally(() => process.exit(130));
      return;
    }
    signalled = true;
    server.deps.logger.info({ signal: sig, grace_ms: server.deps.config.shutdownGraceMs }, 'shutting down');
    server
      .close()
      .then(beforeExit)
      .then(() => process.exit(0))
      .catch(() => process.exit(1));
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
}

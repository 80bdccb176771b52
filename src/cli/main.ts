import { Command } from 'commander';
import { positiveInt, registerClientCommands } from './commands.js';

const program = new Command()
  .name('regen')
  .description('Control plane for large LLM completion-regeneration runs across a pool of SGLang servers')
  .showHelpAfterError()
  // A command line commander cannot parse is a usage error: exit 2, as the client commands do.
  .exitOverride((err) => process.exit(err.exitCode === 0 ? 0 : 2));

program
  .command('serve')
  .description('run the API and the runner (settings from REGEN_* variables; flags win)')
  .option('--port <port>', 'port to listen on (REGEN_PORT, default 8080)')
  .option('--host <host>', 'address to bind (REGEN_HOST, default 127.0.0.1)')
  .option('--data <dir>', 'data folder: database and default object store (REGEN_DATA, default ./data)')
  .option('--output-uri <uri>', 'default output location, s3://bucket/prefix/ or file:///path/ (REGEN_OUTPUT_URI)')
  .option('--input-roots <dirs>', 'comma-separated folders file:// inputs may come from (REGEN_INPUT_ROOTS)')
  .option('--log-level <level>', 'trace, debug, info, warn, error (REGEN_LOG_LEVEL, default info)')
  .action(async (flags) => {
    // The runner thread loads its modules while this thread loads the server's: a restart
    // dispatches again sooner. Both are loaded on use, so the client commands start without them.
    const { RunnerThread } = await import('../runner/thread.js');
    const runnerThread = RunnerThread.spawn();
    const { serveCommand } = await import('./serve.js');
    await serveCommand(flags, runnerThread);
  });

program
  .command('sim')
  .description('run the SGLang simulator (for tests, benchmarks and the demo); see `regen sim --help`')
  .allowUnknownOption()
  .helpOption(false)
  .argument('[args...]')
  .action(async (args: string[]) => {
    const { runSimCommand } = await import('../sim/cli.js');
    await runSimCommand(args);
  });

program
  .command('demo')
  .description('start a server, two simulators and a sample run, and follow it to the end')
  .option('--data <dir>', 'data folder', './data')
  .option('--samples <n>', 'how many prompts', positiveInt('--samples'), 3000)
  .option('--port <port>', 'port for the API (0 picks a free one)', '0')
  .option('--keep', 'keep serving after the run, to look at the dashboard')
  .action(async (flags) => {
    const { demoCommand } = await import('./demo.js');
    await demoCommand(flags);
  });

registerClientCommands(program);

await program.parseAsync(process.argv);

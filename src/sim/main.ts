import { runSimCommand } from './cli.js';

await runSimCommand(process.argv.slice(2));

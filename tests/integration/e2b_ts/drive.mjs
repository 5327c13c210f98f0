// One flow of the official TypeScript `e2b` SDK against Firepool's E2B layer (E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY in the environment): create, run with streamed stdout, write/read/list files, a background
// command killed, reconnect by id, kill. Prints what it saw as one JSON object.
import { Sandbox } from 'e2b'

const seen = { stdout: [] }
const sbx = await Sandbox.create('cpu', { timeoutMs: 60_000 })
seen.id = sbx.sandboxId
const res = await sbx.commands.run('for i in 1 2; do echo line$i; done', { onStdout: (s) => seen.stdout.push(s) })
seen.exitCode = res.exitCode
seen.runStdout = res.stdout
await sbx.files.write('ts.txt', 'from ts')
seen.read = await sbx.files.read('ts.txt')
seen.listed = (await sbx.files.list('.')).map((e) => e.name)
const bg = await sbx.commands.run('sleep 60', { background: true })
seen.killed = await bg.kill()
const again = await Sandbox.connect(sbx.sandboxId)
seen.againRead = await again.files.read('ts.txt')
seen.running = await sbx.isRunning()
seen.kill = await sbx.kill()
seen.afterKill = await sbx.isRunning()
console.log(JSON.stringify(seen))

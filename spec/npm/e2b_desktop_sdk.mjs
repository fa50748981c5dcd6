// The official `@e2b/desktop` SDK against the E2B stand-in (spec/support/e2b_service.lua), run by
// spec/providers/e2b_spec.lua: create (which starts the display and Xfce), a screenshot, clicks,
// typing, a key, the screen size, the live view's URL, kill. The stand-in answers the desktop's
// commands with a fixed PNG and records the actions. Prints one JSON line; exits 1 on a failure.
import { Sandbox } from '@e2b/desktop';

const opts = {
  apiKey: process.env.E2B_API_KEY,
  apiUrl: process.env.E2B_API_URL,
  sandboxUrl: process.env.E2B_SANDBOX_URL,
  domain: process.env.E2B_DOMAIN,
  requestTimeoutMs: 30000,
};

const out = {};
try {
  const d = await Sandbox.create({ ...opts, timeoutMs: 120000, allowInternetAccess: false });
  out.id = d.sandboxId;
  const png = await d.screenshot();
  out.png = { length: png.length, signature: Buffer.from(png.slice(0, 8)).toString('hex') };
  await d.leftClick(100, 200);
  await d.doubleClick(30, 40);
  await d.write("it's typed");
  await d.press('enter');
  await d.press(['ctrl', 'c']);
  await d.scroll('up', 3);
  await d.drag([1, 2], [300, 400]);
  out.size = await d.getScreenSize();
  out.cursor = await d.getCursorPosition();
  await d.stream.start();
  out.viewUrl = d.stream.getUrl();
  out.echo = (await d.commands.run('echo $DISPLAY')).stdout;
  out.killed = await d.kill();
  console.log(JSON.stringify(out));
} catch (e) {
  console.log(JSON.stringify({ ...out, error: String(e && e.stack || e) }));
  process.exit(1);
}

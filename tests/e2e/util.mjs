// Helpers shared by the end-to-end tests.
import net from 'node:net';

// A TCP port free on 127.0.0.1 right now (the server is told to bind it).
export async function freePort() {
  const srv = net.createServer();
  await new Promise((resolve) => srv.listen(0, '127.0.0.1', resolve));
  const { port } = srv.address();
  await new Promise((resolve) => srv.close(resolve));
  return port;
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

"""The front of the embedded broker: what makes a Tansu restart lose data the way a broker does, and no
more (issue 15).

Tansu keeps everything in memory, so a restart comes back with no topics; and it acknowledges a record
produced to a topic that does not exist, or to a partition beyond a topic's count, then keeps it nowhere
(a topic created afterwards is empty). Between a restart and the operator recreating the topics every
producer's record is acknowledged and lost: a submission the gateway confirmed, a relay's StartJob, an
agent's exit report. The chaos campaign found it as submissions that never reached the store, and as
nodes declared lost whose heartbeats went to partitions a topic auto-created with 4 partitions did not
have. Apache Kafka refuses both (``auto.create.topics.enable`` is off), and producers retry.

So the stack's Tansu listens on a private port, and clients reach it through this front on the public
port: the front passes bytes through while the broker is up, remembers the topics it has (names and
partition counts, asked every half second), drops every client connection the moment the broker goes,
and when a broker answers again with topics missing it creates them as they were *before it lets any
client in*; until then a connection is closed as soon as it is accepted, which a client treats as a
broker that is down. Offsets, records and groups are still lost, as with a broker that lost its disk;
consumers notice by its new cluster id (`gpusched_common.incarnation`).

Run as ``python -m gpusched_common.infra.tansu_front --listen PORT --backend PORT``
(`gpusched_common.infra.brokers` starts it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket

from aiokafka.conn import create_conn
from aiokafka.errors import KafkaError, TopicAlreadyExistsError
from aiokafka.protocol.admin import CreateTopicsRequest
from aiokafka.protocol.metadata import MetadataRequest

from gpusched_common.kafka_admin import DEFAULT_MAX_MESSAGE_BYTES

log = logging.getLogger("gpusched.tansu_front")

POLL_S = 0.5  # how often the broker's topics are asked (a topic created just before a crash may be missed)


class Front:
    def __init__(self, backend_port: int) -> None:
        self.backend_port = backend_port
        self.open = False
        self.layout: dict[str, int] = {}  # the topics the broker had, and their partition counts
        self._writers: set[asyncio.StreamWriter] = set()

    # --- clients -------------------------------------------------------------------------------------

    async def client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.close()  # the broker is down, or back without its topics yet
            return
        try:
            back_reader, back_writer = await asyncio.open_connection("127.0.0.1", self.backend_port)
        except OSError:
            writer.close()
            return
        pair = (writer, back_writer)
        self._writers.update(pair)
        try:
            await asyncio.gather(self._pump(reader, back_writer, pair), self._pump(back_reader, writer, pair))
        finally:
            for w in pair:
                self._writers.discard(w)
                w.close()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter]) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            for w in pair:  # one side ended: so does the other direction
                w.close()

    def _drop_clients(self) -> None:
        self.open = False
        for w in list(self._writers):
            w.close()
        self._writers.clear()

    # --- the broker ----------------------------------------------------------------------------------

    async def watch(self) -> None:
        while True:
            conn = await self._connect()
            try:
                if self.layout:
                    await self._restore(conn)
                self.layout = await self._topics(conn)
                self.open = True
                log.info("broker on port %d is up with %d topic(s): clients let in", self.backend_port,
                         len(self.layout))
                while conn.connected():
                    await asyncio.sleep(POLL_S)
                    self.layout = await self._topics(conn) or self.layout
            except (KafkaError, OSError, asyncio.TimeoutError) as exc:
                log.warning("broker on port %d is gone (%s): clients dropped", self.backend_port,
                            type(exc).__name__)
            finally:
                self._drop_clients()
                conn.close()

    async def _connect(self):  # noqa: ANN202 - an aiokafka connection
        while True:
            try:
                return await create_conn("127.0.0.1", self.backend_port, client_id="gpusched-tansu-front",
                                         request_timeout_ms=5000, on_close=lambda *_: self._drop_clients())
            except (KafkaError, OSError, asyncio.TimeoutError):
                await asyncio.sleep(0.05)

    @staticmethod
    async def _topics(conn) -> dict[str, int]:  # noqa: ANN001
        metadata = await conn.send(MetadataRequest(None))
        out = {}
        for topic in metadata.topics:
            error, name, partitions = (topic[0], topic[1], topic[-1])
            if error == 0:
                out[name] = len(partitions)
        return out

    async def _restore(self, conn) -> None:  # noqa: ANN001
        """Create the topics the broker had before, as they were, until it has every one."""
        while True:
            have = await self._topics(conn)
            missing = {name: n for name, n in self.layout.items() if name not in have}
            if not missing:
                return
            response = await conn.send(CreateTopicsRequest(
                [(name, n, 1, [], [("max.message.bytes", str(DEFAULT_MAX_MESSAGE_BYTES))]) for name, n in missing.items()],
                10_000, False))
            refused = [(name, code) for name, code, *_ in response.topic_errors
                       if code not in (0, TopicAlreadyExistsError.errno)]
            log.warning("broker on port %d came back without %d topic(s): created them as they were%s",
                        self.backend_port, len(missing), f" (refused: {refused})" if refused else "")
            if refused:
                await asyncio.sleep(0.2)


async def serve(listen_port: int, backend_port: int) -> None:
    front = Front(backend_port)
    watcher = asyncio.ensure_future(front.watch())
    while not front.open:  # the port opens once the broker first answered: a start waits for the port
        await asyncio.sleep(0.02)
    server = await asyncio.start_server(front.client, "127.0.0.1", listen_port, reuse_address=True,
                                        family=socket.AF_INET)
    async with server:
        await asyncio.gather(server.serve_forever(), watcher)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", type=int, required=True, help="the port clients connect to")
    parser.add_argument("--backend", type=int, required=True, help="the port Tansu listens on")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s tansu-front %(levelname)s %(message)s")
    asyncio.run(serve(args.listen, args.backend))


if __name__ == "__main__":
    main()

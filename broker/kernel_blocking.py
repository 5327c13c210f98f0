"""`Kernel`: the synchronous form of `broker.kernel_client.AsyncKernel`, for scripts and notebooks.

    from broker.client import Client
    from broker.kernel_blocking import Kernel
    with Client() as fp, Kernel.start(fp, pool="cpu") as k:
        print(k.execute("x = 41; print(x + 1)").stdout)

The websocket lives on a private event loop in a daemon thread; each call runs there and blocks for it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from broker.aclient import AsyncClient
from broker.kernel_client import AsyncKernel, Execution, kernels, kernelspecs
from broker.sdk_protocols import SyncCalls

T = TypeVar("T")


class BackgroundLoop:
    """An event loop in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="firepool-kernel", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.loop.close()


class Kernel:
    """A kernel behind the broker's gateway, driven synchronously (same methods as `AsyncKernel`)."""

    def __init__(self, loop: BackgroundLoop, client: AsyncClient, kernel: AsyncKernel) -> None:
        self._loop, self._client, self.kernel = loop, client, kernel
        self.id, self.name = kernel.id, kernel.name

    @classmethod
    def start(cls, fp: SyncCalls, name: str | None = None, *, pool: str | None = None,
              env: Mapping[str, str] | None = None, ready_timeout: float = 120.0) -> Kernel:
        """As `AsyncKernel.start`, connected and answering kernel_info."""
        loop = BackgroundLoop()
        client = AsyncClient(fp.urls, fp.found.token, retry=fp.retry)
        try:
            kernel = loop.run(AsyncKernel.start(client, name, pool=pool, env=env, ready_timeout=ready_timeout))
        except BaseException:
            loop.run(client.close())
            loop.stop()
            raise
        return cls(loop, client, kernel)

    @property
    def protocol(self) -> str | None:
        return self.kernel.protocol

    def execute(self, code: str, *, timeout: float = 600.0, silent: bool = False,
                user_expressions: Mapping[str, str] | None = None) -> Execution:
        return self._loop.run(self.kernel.execute(code, timeout=timeout, silent=silent,
                                                  user_expressions=user_expressions))

    def kernel_info(self, timeout: float = 30.0) -> dict[str, Any]:
        return self._loop.run(self.kernel.kernel_info(timeout))

    def interrupt(self) -> None:
        self._loop.run(self.kernel.interrupt())

    def restart(self) -> dict[str, Any]:
        return self._loop.run(self.kernel.restart())

    def refresh(self) -> dict[str, Any]:
        return self._loop.run(self.kernel.refresh())

    def shutdown(self) -> None:
        """End the kernel and this object's loop."""
        try:
            self._loop.run(self.kernel.shutdown())
        finally:
            self._loop.run(self._client.close())
            self._loop.stop()

    def __enter__(self) -> Kernel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def list_kernelspecs(fp: SyncCalls) -> dict[str, Any]:
    """`GET /api/kernelspecs` with a synchronous client."""
    return dict(fp._call("GET", "/api/kernelspecs").json())


def list_kernels(fp: SyncCalls) -> list[dict[str, Any]]:
    return list(fp._call("GET", "/api/kernels").json())


__all__ = ["Kernel", "Execution", "list_kernelspecs", "list_kernels", "kernels", "kernelspecs"]

"""Reaching a Ray cluster, for stage 2's scorer replicas (execute/ray_pool.py) and a build's embedding
(embedding/ray_batches.py): its address checked before Ray is asked (ray.init retries an unreachable address for
minutes), and the environment a model needs offline passed to its workers."""

from __future__ import annotations

import os
import socket


class RayUnavailable(RuntimeError):
    """Ray is not installed, or the cluster cannot be reached or holds no worker for the job."""


# Forwarded to the workers when the caller sets them (offline model loading, where converted models are kept).
FORWARDED_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "GRADFUSE_CACHE")


def connect(address: str, *, use: str, reuse: bool = False):
    """Ray, connected to the cluster at `address` (HOST:PORT, ray://HOST:PORT or "auto"); `use`: the option that
    asked for it, named where Ray is missing; `reuse`: keep the connection this process has already (a server's
    scorer replicas), where it has one."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable(f"Ray is not installed: pip install 'gradfuse[ray]' (or run without {use})") from None
    if reuse and ray.is_initialized():
        return ray
    _probe(_bootstrap_address(address))
    env = {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
    try:
        ray.init(address=address, log_to_driver=False, logging_level="ERROR", configure_logging=False,
                 runtime_env={"env_vars": env} if env else None)
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise RayUnavailable(f"cannot reach the Ray cluster at {address!r}: {error}") from None
    return ray


def _bootstrap_address(address: str) -> str:
    """HOST:PORT that `address` points at ("auto": Ray's own lookup, RAY_ADDRESS or the last cluster started here)."""
    if address == "auto":
        from ray._private.services import get_ray_address_from_environment

        try:
            address = get_ray_address_from_environment("auto", None)
        except ConnectionError as error:
            raise RayUnavailable(f"no running Ray cluster found for --ray auto: {error}") from None
    return address.removeprefix("ray://")


def _probe(address: str, timeout_s: float = 5.0) -> None:
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return  # not HOST:PORT: ray.init judges it
    try:
        connection = socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s)
    except OSError as error:
        raise RayUnavailable(f"cannot reach the Ray cluster at {address}: nothing answers there "
                             f"({error.strerror or error}); start one with `ray start --head` or give the address "
                             "of a running cluster") from None
    with connection:
        if not _speaks_grpc(connection):
            raise RayUnavailable(f"{address} answers, but not as a Ray cluster does (no gRPC there: another "
                                 "server on that port?); give the address `ray start --head` printed") from None


# HTTP/2's client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS and its client server are) answers
# with a SETTINGS frame of its own; an HTTP/1 server answers otherwise or waits, and ray.init would retry for minutes.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _speaks_grpc(connection: socket.socket) -> bool:
    try:
        connection.sendall(_HTTP2_PREFACE)
        header = b""
        while len(header) < 9:
            chunk = connection.recv(9 - len(header))
            if not chunk:
                return False
            header += chunk
    except OSError:  # the timeout included
        return False
    return header[3] == 4  # a frame's type: SETTINGS

#!/usr/bin/env python3
"""Calls mmkd's NodeService/GetNode over its Unix socket with grpcio alone (no generated
stubs) and prints the node's hostname and backend.

    python3 -m pip install grpcio
    python3 examples/python/get_node.py /run/mmk/mmkd.sock

grpcio sends the socket's path as the HTTP/2 :authority, which mmkd's HTTP/2 server
refuses (every call fails with RST_STREAM); the channel option grpc.default_authority
sets a valid one. docs/api.md, "Python".
"""
import sys

import grpc


def fields(msg: bytes):
    """The top-level (field number, wire type, value) of a protobuf message."""
    i = 0

    def varint():
        nonlocal i
        shift = value = 0
        while True:
            b = msg[i]
            i += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value

    while i < len(msg):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            yield number, wire, varint()
        elif wire == 2:
            n = varint()
            yield number, wire, msg[i : i + n]
            i += n
        elif wire == 1:
            yield number, wire, msg[i : i + 8]
            i += 8
        elif wire == 5:
            yield number, wire, msg[i : i + 4]
            i += 4
        else:
            raise ValueError(f"wire type {wire}")


def main() -> int:
    socket = sys.argv[1] if len(sys.argv) > 1 else "/run/mmk/mmkd.sock"
    channel = grpc.insecure_channel(
        "unix:" + socket, options=[("grpc.default_authority", "localhost")]
    )
    get_node = channel.unary_unary(
        "/mmk.v1.NodeService/GetNode",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    reply = get_node(b"", timeout=10)  # GetNodeRequest has no fields
    node = {n: v for n, w, v in fields(reply) if w == 2 and n in (1, 2)}
    # mmk.v1.Node: hostname = 1, backend = 2
    print(f"hostname={node.get(1, b'').decode()} backend={node.get(2, b'').decode()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

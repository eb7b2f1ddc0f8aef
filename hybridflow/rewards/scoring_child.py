"""The scoring process of :class:`hybridflow.rewards.process_calls.ProcessCallRunner`, run by its file path.

Run as a script (not imported through ``hybridflow.rewards``, which loads torch), it says it is ready (an
empty frame), then answers calls until its stdin closes: each request is a length-prefixed cloudpickled
zero-argument call; each answer a length-prefixed pickle of ``(status, value, error)``. The protocol keeps the
original stdout; ``print`` in a scoring function goes to stderr.
"""

import os
import pickle
import struct
import sys

import cloudpickle

HEADER = struct.Struct("<Q")


def _read_exactly(stream, size: int) -> bytes:
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return data


def serve() -> None:
    requests = sys.stdin.buffer
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr
    answers.write(HEADER.pack(0))  # ready: the parent starts a call's clock only now
    answers.flush()
    while True:
        try:
            (size,) = HEADER.unpack(_read_exactly(requests, HEADER.size))
            payload = _read_exactly(requests, size)
        except EOFError:
            return
        try:
            answer = ("ok", cloudpickle.loads(payload)(), "")
            data = pickle.dumps(answer)
        except Exception as error:  # a user's scoring function may raise anything; its result may not pickle
            data = pickle.dumps(("error", None, f"{type(error).__name__}: {error}"))
        answers.write(HEADER.pack(len(data)) + data)
        answers.flush()


if __name__ == "__main__":
    serve()

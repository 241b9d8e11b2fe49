"""First code a sandboxed interpreter runs: set limits, then run, serve or check (never two of these).

Run inside bubblewrap as ``python -I -B -S -c <this file's text> JOB_FD`` by
``intellect_node.node.tasks.sandbox``; the standard library only. The job (JSON) is read from
``JOB_FD`` and the descriptor closed before any untrusted code runs. Modes:

- ``run``: the program runs as ``__main__`` on the given stdin (stdin/stdout tests, run_python);
- ``serve``: the program runs as ``__main__``, then this process answers calls to its top-level
  functions on a pipe, arguments and results as plain values (``encode``/``decode``). Whatever the
  program does to this interpreter (exits, trace hooks, odd ``__eq__``) only shapes its answers;
- ``check``: the task's trusted test code runs against proxies of those functions, in ANOTHER
  sandbox that never executes model-written code, and writes a pass record only when the test
  code returns normally. The verdict lives here, not in the program's process.

Plain values are checked by exact type (``type(x) is int``), never with ``isinstance``, and the
checker compares only values it decoded itself, so a candidate's ``__eq__`` is never called.
"""

import builtins
import importlib
import json
import os
import resource
import sys
import types

MAX_DEPTH = 64
MAX_MESSAGE = 1 << 20
# stdlib modules a checker will not import on a program's say-so (side effects, no use in a test)
_NO_IMPORT = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "pdb"}
_TAGS = {list: "L", tuple: "T", set: "S", frozenset: "F"}
_BUILDERS = {"L": list, "T": tuple, "S": set, "F": frozenset}


def encode(value, depth=0):
    """A JSON-able form of a plain value; TypeError for anything else (subclasses included)."""
    kind = type(value)
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if value is None or kind in (bool, int, float, str):
        return value
    if kind in _TAGS:
        return {_TAGS[kind]: [encode(item, depth + 1) for item in value]}
    if kind is dict:
        return {"D": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"B": value.hex()}
    if kind is complex:
        return {"C": [value.real, value.imag]}
    raise TypeError(f"not a plain value: {kind.__name__}")


def decode(data, depth=0):
    """The inverse of ``encode``: builds builtin types only; ValueError on anything malformed."""
    kind = type(data)
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if data is None or kind in (bool, int, float, str):
        return data
    if kind is not dict or len(data) != 1:
        raise ValueError("malformed value")
    [(tag, body)] = data.items()
    if tag in _BUILDERS and type(body) is list:
        return _BUILDERS[tag](decode(item, depth + 1) for item in body)
    if tag == "D" and type(body) is list and all(type(p) is list and len(p) == 2 for p in body):
        return {decode(k, depth + 1): decode(v, depth + 1) for k, v in body}
    if tag == "B" and type(body) is str:
        return bytes.fromhex(body)
    if tag == "C" and type(body) is list and len(body) == 2 and all(type(x) is float for x in body):
        return complex(body[0], body[1])
    raise ValueError(f"malformed value tagged {tag!r}")


def read_message(stream):
    """One JSON line of at most MAX_MESSAGE bytes; None at end of stream."""
    line = stream.readline(MAX_MESSAGE + 1)
    if not line:
        return None
    if len(line) > MAX_MESSAGE or not line.endswith(b"\n"):
        raise ValueError("message too long")
    message = json.loads(line)
    if type(message) is not dict:
        raise ValueError("malformed message")
    return message


def write_message(stream, message):
    stream.write(json.dumps(message).encode() + b"\n")
    stream.flush()


def set_limits(job):
    # memory_bytes is the run's budget less the two tmpfs caps (SandboxLimits.address_space_bytes)
    memory, cpu = job["memory_bytes"], job["cpu_seconds"]
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    # SIGXCPU at the soft limit (reported as a timeout), SIGKILL a second later if it is caught
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["file_bytes"], job["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # counted per user in this run's own user namespace; seccomp already refuses fork, so this
    # only bounds threads
    resource.setrlimit(resource.RLIMIT_NPROC, (16, 16))
    # no POSIX message-queue bytes (seccomp refuses mq_* as well) and no pages locked in RAM
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, 0))


def load_program(source):
    """Run ``source`` as ``__main__`` (from /work/main.py, so tracebacks show its lines)."""
    path = os.path.join(os.getcwd(), "main.py")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(source)
    module = types.ModuleType("__main__")
    module.__file__ = path
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    sys.argv = [path]
    exec(compile(source, path, "exec"), module.__dict__)
    return module.__dict__


def describe(namespace):
    """What a checker may use of the program's globals: functions, plain values, stdlib modules."""
    names = {}
    for name, value in list(namespace.items()):
        if type(name) is not str or name.startswith("__"):
            continue
        if type(value) is types.ModuleType:
            names[name] = {"module": value.__name__}
        elif callable(value):
            names[name] = {"callable": True}
        else:
            try:
                names[name] = {"value": encode(value)}
            except (TypeError, ValueError, RecursionError):
                continue
    return names


def serve(job, namespace):
    requests = os.fdopen(job["requests_fd"], "rb")
    answers = os.fdopen(job["answers_fd"], "wb")
    write_message(answers, {"names": describe(namespace)})
    while (request := read_message(requests)) is not None:
        try:
            function = namespace[request["call"]]
            result = function(*decode(request["args"]), **decode(request["kwargs"]))
            reply = {"value": encode(result)}
        except BaseException as exc:  # SystemExit from the function is a failed call, not an exit
            reply = {"raised": type(exc).__name__, "message": repr(exc.args)[:1000]}
        write_message(answers, reply)


class CandidateError(Exception):
    """The program's function raised, or answered with something that is not a plain value."""


class Remote:
    """A checker's stand-in for one of the program's functions: plain values in and out."""

    def __init__(self, name, requests, answers):
        self.name, self._requests, self._answers = name, requests, answers

    def __call__(self, *args, **kwargs):
        write_message(self._requests, {"call": self.name, "args": encode(list(args)),
                                       "kwargs": encode(dict(kwargs))})
        reply = read_message(self._answers)
        if reply is None:
            raise CandidateError(f"{self.name}: the program's process is gone")
        if "value" in reply:
            return decode(reply["value"])
        raised = getattr(builtins, str(reply.get("raised")), None)
        message = f"{self.name} raised {reply.get('raised')!s:.100} {reply.get('message')!s:.200}"
        if type(raised) is type and issubclass(raised, Exception):
            raise raised(message)
        raise CandidateError(message)

    def __repr__(self):
        return f"<program function {self.name}>"


def check(job):
    requests = os.fdopen(job["requests_fd"], "wb")
    answers = os.fdopen(job["answers_fd"], "rb")
    hello = read_message(answers)
    if hello is None or type(hello.get("names")) is not dict:
        raise CandidateError("the program did not load")
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    for name, spec in hello["names"].items():
        if not name.isidentifier() or name.startswith("__") or hasattr(builtins, name) or type(spec) is not dict:
            continue  # a program must not shadow what the test code uses, e.g. abs or all
        if spec.get("callable") is True:
            namespace[name] = Remote(name, requests, answers)
        elif "value" in spec:
            namespace[name] = decode(spec["value"])
        elif type(spec.get("module")) is str:
            module = spec["module"]
            if module.split(".")[0] in sys.stdlib_module_names and module.split(".")[0] not in _NO_IMPORT:
                namespace[name] = importlib.import_module(module)
    exec(compile(job["test"], "test.py", "exec"), namespace)
    with os.fdopen(job["result_fd"], "wb") as result:
        result.write(b'{"passed": true}\n')


def main():
    with os.fdopen(int(sys.argv[1]), "rb") as handle:
        job = json.loads(handle.read())
    set_limits(job)
    import site  # for exit() and quit() as under a normal start; -S skipped it

    site.setquit()
    if job["mode"] == "check":
        check(job)
        return
    namespace = load_program(job["program"])
    if job["mode"] == "serve":
        serve(job, namespace)


main()

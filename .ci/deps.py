"""Print the interpreter and dependency versions of the running environment, one line, for the
summary of .ci/run ("ci-deps: python 3.13.0, numpy 2.5.5, ...")."""

import importlib.metadata as md
import platform

NAMES = ["numpy", "pyelftools", "iced-x86", "matplotlib", "starlette", "uvicorn", "websockets",
         "pytest", "mypy", "ruff"]


def version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


found = [f"{n} {v}" for n in NAMES if (v := version(n)) is not None]
print("ci-deps: python " + platform.python_version() + ", " + ", ".join(found))

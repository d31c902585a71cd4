"""Entry points with their own key trees (``jrl.sft``, ``jrl.generate``, ``jrl.evaluate``): from a
command line to a checked config (file or defaults -> overrides -> resolve -> validate, the syntax
of ``jrl.train``), and bad input reported as one line with a non-zero exit status."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from ml_collections import ConfigDict

from jrl.config.errors import ConfigError
from jrl.config.loading import read_config
from jrl.config.trees import KeyTree

# Errors that bad configs, files or data raise: reported in one line, exit status 2.
INPUT_ERRORS = (
    ConfigError,
    FileNotFoundError,
    ImportError,
    KeyError,
    TypeError,
    ValueError,
    NotImplementedError,
)


def load_entry_config(
    argv: Sequence[str], tree: KeyTree, validate: Callable[[ConfigDict], None]
) -> ConfigDict:
    """The checked, resolved config of a command line (without the program name): the file of
    ``--config=FILE.py[:preset]`` (else `tree`'s defaults), then the overrides."""
    config = read_config(argv, tree)[0]
    validate(config)
    return config


def run_entry(
    prog: str,
    main: Callable[[], Any],
    failures: Sequence[tuple[type[BaseException] | tuple[type[BaseException], ...], int]] = (
        (INPUT_ERRORS, 2),
    ),
) -> int:
    """Runs `main`; an error of a kind listed in `failures` is printed as ``prog: error: ...`` and
    its exit status returned (the first matching entry wins). Returns 0 on success."""
    try:
        main()
    except BaseException as err:
        for kinds, status in failures:
            if isinstance(err, kinds):
                message = err.args[0] if isinstance(err, KeyError) and err.args else err
                print(f"{prog}: error: {message}", file=sys.stderr)
                return status
        raise
    return 0

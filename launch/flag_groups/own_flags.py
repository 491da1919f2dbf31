"""The parser of an entry point that keeps its flags in a FlagValues of its own (not absl's global FLAGS)."""

from __future__ import annotations

import sys
from typing import Callable

from absl import flags


def own_flags_parser(flag_values: flags.FlagValues, doc: str) -> Callable[[list[str]], list[str]]:
    """For `app.run(main, flags_parser=...)`: parses `flag_values` from argv and returns the rest; `--help` prints
    `doc` and the flags' help. absl's own flags (logging) keep their defaults."""

    def parse(argv: list[str]) -> list[str]:
        if any(arg in ("-h", "--help", "--helpfull") for arg in argv[1:]):
            print(doc)
            print(flag_values.get_help())
            sys.exit(0)
        rest = flag_values(argv)
        flags.FLAGS.mark_as_parsed()
        return rest

    return parse

#!/usr/bin/env python3
"""Convert an image folder into WebDataset shards: the same as ``wdsx convert SRC DEST [options]``."""

import sys

from wdsx.commands.cli import main

if __name__ == "__main__":
    sys.exit(main(["convert", *sys.argv[1:]]))

"""Writes what a script sees (``__name__``, ``sys.argv``, sys.path[0], its env) to the file
argv[1] (``RANK`` in the name is replaced by the rank);
``raise`` / ``exit N`` in argv[2] make it fail."""

import json
import os
import sys

seen = {
    "name": __name__,
    "argv": sys.argv,
    "path0": sys.path[0],
    "rank": os.environ["RANK"],
    "world": os.environ["WORLD_SIZE"],
    "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
}
with open(sys.argv[1].replace("RANK", os.environ["RANK"]), "w") as f:
    json.dump(seen, f)
if len(sys.argv) > 2 and sys.argv[2] == "raise":
    raise RuntimeError("the probe script failed on purpose")
if len(sys.argv) > 3 and sys.argv[2] == "exit":
    sys.exit(int(sys.argv[3]))

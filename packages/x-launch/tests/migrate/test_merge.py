"""``x-launch migrate`` joins the imports of one x module within a run of import statements."""

from __future__ import annotations

from pathlib import Path

from x_launch.migrate.rewrite import migrate_source

BEFORE = """\
import os
from accelerate import Accelerator, init_empty_weights  # the facade
from torch import nn
from accelerate.utils import set_seed, gather, get_max_memory

from accelerate.utils import set_seed  # seeding again
from accelerate.utils import x_lacks_this_name
from accelerate.hooks import add_hook_to_module as add_hook
print("code runs here: the run ends")
from accelerate.utils import broadcast
from accelerate.data_loader import DataLoaderShard
from torch.distributed import gather
from accelerate.utils import gather, set_seed
from accelerate import *
from accelerate.utils import pad_across_processes


def build():
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    return Accelerator, set_seed
"""

AFTER = """\
import os
from x_runtime import Accelerator, set_seed, gather
from x_bigmodel import init_empty_weights, get_max_memory, add_hook_to_module as add_hook  # the facade
from torch import nn

# seeding again
from accelerate.utils import x_lacks_this_name
print("code runs here: the run ends")
from x_runtime import broadcast, DataLoaderShard
from torch.distributed import gather
from x_runtime import gather, set_seed
from x_runtime import *
from x_runtime import pad_across_processes


def build():
    from x_runtime import Accelerator, set_seed
    return Accelerator, set_seed
"""


def test_one_import_line_per_x_module_in_each_run(migrate_write, tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(BEFORE)
    err = migrate_write(path)
    # set_seed once; the comment of a statement merged away keeps its place; x's gather is not
    # moved before torch's (the later import must still win); `*` binds unknown names: a run ends.
    assert path.read_text() == AFTER
    assert err.splitlines() == [
        f"x-launch migrate: {path}:7: x has no accelerate.utils.x_lacks_this_name; its import from Accelerate stays"
    ]


def test_merged_imports_bind_what_the_original_bound() -> None:
    source = "from accelerate import a as z\nfrom accelerate.utils import b as z\n"
    migrated = migrate_source(source)
    # Not x's names: left as written (nothing to merge); x's names with aliases keep their order.
    assert migrated == source
    source = "from accelerate import gather as g\nfrom accelerate.utils import broadcast as g\n"
    assert migrate_source(source) == "from x_runtime import gather as g, broadcast as g\n"  # the last one binds g

"""``x-launch migrate`` on a script with a PEP 723 block: ``accelerate`` becomes x's distributions."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

needs_tomllib = pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is Python 3.11+")


def block_dependencies(text: str) -> list[str]:
    """The script block's ``dependencies`` as a PEP 723 reader (uv, pipx) gets them."""
    import tomllib

    (content,) = re.findall(r"(?m)^# /// script$\s((?:^#(?:| .*)$\s)+)^# ///$", text)
    toml = "".join(line[2:] if line.startswith("# ") else line[1:] for line in content.splitlines(True))
    return tomllib.loads(toml)["dependencies"]


ONE_PER_LINE = """\
#!/usr/bin/env python
# /// script
# requires-python = ">=3.10"
# dependencies = [
#   "torch>=2.4",
#   "accelerate[deepspeed]>=1.0; python_version >= '3.10'",  # the trainer
#   "numpy",
# ]
#
# [tool.uv]
# exclude-newer = "2026-01-01T00:00:00Z"
# ///
from accelerate import Accelerator, init_empty_weights
"""


@needs_tomllib
def test_accelerate_becomes_each_x_distribution_the_script_imports(migrate_write, tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(ONE_PER_LINE)
    assert migrate_write(path) == ""
    after = path.read_text()
    # The version goes (x's are its own), the marker stays, the deepspeed extra is x-runtime's too;
    # one per line, same indentation, the comment stays at the end of what replaced its line.
    assert after == (
        "#!/usr/bin/env python\n"
        "# /// script\n"
        '# requires-python = ">=3.10"\n'
        "# dependencies = [\n"
        '#   "torch>=2.4",\n'
        "#   \"x-runtime[deepspeed]; python_version >= '3.10'\",\n"
        "#   \"x-bigmodel; python_version >= '3.10'\",  # the trainer\n"
        '#   "numpy",\n'
        "# ]\n"
        "#\n"
        "# [tool.uv]\n"
        '# exclude-newer = "2026-01-01T00:00:00Z"\n'
        "# ///\n"
        "from x_runtime import Accelerator\n"
        "from x_bigmodel import init_empty_weights\n"
    )
    assert block_dependencies(after) == [
        "torch>=2.4",
        "x-runtime[deepspeed]; python_version >= '3.10'",
        "x-bigmodel; python_version >= '3.10'",
        "numpy",
    ]


@needs_tomllib
def test_inline_block_keeps_accelerate_for_a_name_x_lacks_and_lists_nothing_twice(
    migrate_write, tmp_path: Path
) -> None:
    path = tmp_path / "train.py"
    path.write_text(
        "# /// script\n"
        "# dependencies = ['Accelerate>=1.0', \"x-bigmodel\", 'torch']\n"
        "# ///\n"
        "from accelerate import Accelerator, init_empty_weights\n"
        "from accelerate.utils import x_lacks_this_name\n"
    )
    migrate_write(path)
    after = path.read_text()
    assert after == (
        "# /// script\n"
        "# dependencies = ['Accelerate>=1.0', 'x-runtime', \"x-bigmodel\", 'torch']\n"
        "# ///\n"
        "from x_runtime import Accelerator\n"
        "from x_bigmodel import init_empty_weights\n"
        "from accelerate.utils import x_lacks_this_name\n"
    )
    assert block_dependencies(after) == ["Accelerate>=1.0", "x-runtime", "x-bigmodel", "torch"]


@needs_tomllib
def test_accelerate_already_covered_by_listed_x_distributions_goes(migrate_write, tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(
        '# /// script\n# dependencies = ["x-runtime>=0.1", "accelerate_extras", "accelerate"]\n# ///\n'
        "import accelerate\n"
    )
    migrate_write(path)
    after = path.read_text()
    assert after == (
        '# /// script\n# dependencies = ["x-runtime>=0.1", "accelerate_extras"]\n# ///\nimport x_runtime as accelerate\n'
    )
    assert block_dependencies(after) == ["x-runtime>=0.1", "accelerate_extras"]

    # A script importing nothing from x keeps its block: what it runs accelerate for is not ours.
    text = '# /// script\n# dependencies = ["accelerate"]\n# ///\nimport subprocess\n'
    path.write_text(text)
    migrate_write(path)
    assert path.read_text() == text

"""host_memory on fake /proc and /sys/fs/cgroup trees built in tmp_path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from x_common.host_memory import HostMemory, host_memory

GiB = 2**30
MEM_TOTAL_KB = 16 * 1024 * 1024  # 16 GiB
MEM_AVAILABLE_KB = 10 * 1024 * 1024  # 10 GiB
MACHINE = MEM_TOTAL_KB * 1024
AVAILABLE = MEM_AVAILABLE_KB * 1024
V1_NO_LIMIT = "9223372036854771712"  # what cgroup v1 reports when no limit is set

MEMINFO = f"""\
MemTotal:       {MEM_TOTAL_KB} kB
MemFree:         1048576 kB
MemAvailable:   {MEM_AVAILABLE_KB} kB
Buffers:          123456 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
"""


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


class Host:
    """A fake /proc and /sys/fs/cgroup under tmp_path."""

    def __init__(self, root: Path, meminfo: str | None = MEMINFO, cgroup: str | None = None) -> None:
        self.proc = root / "proc"
        self.cgroup_root = root / "cgroup"
        self.proc.mkdir(parents=True)
        self.cgroup_root.mkdir(parents=True)
        if meminfo is not None:
            write(self.proc / "meminfo", meminfo)
        if cgroup is not None:
            write(self.proc / "self" / "cgroup", cgroup)

    def v2(self, path: str, **files: str | int) -> None:
        """Files of the cgroup v2 directory ``path`` (memory_max= for memory.max, ...)."""
        for name, value in files.items():
            write(self.cgroup_root / path.lstrip("/") / name.replace("_", "."), f"{value}\n")

    def v1(self, path: str, **files: str | int) -> None:
        for name, value in files.items():
            write(self.cgroup_root / "memory" / path.lstrip("/") / name.replace("_", ".", 1), f"{value}\n")

    def memory(self) -> HostMemory:
        return host_memory(proc=self.proc, cgroup_root=self.cgroup_root)


def test_no_cgroup_file(tmp_path: Path) -> None:
    assert Host(tmp_path).memory() == HostMemory(
        total=MACHINE, available=AVAILABLE, machine_total=MACHINE, cgroup_limit=None
    )


def test_meminfo_without_mem_available(tmp_path: Path) -> None:
    host = Host(tmp_path, meminfo=f"MemTotal: {MEM_TOTAL_KB} kB\nMemFree: 100 kB\n")
    assert host.memory() == HostMemory(total=MACHINE, available=None, machine_total=MACHINE)


def test_meminfo_missing_falls_back_to_sysconf(tmp_path: Path) -> None:
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    expected = HostMemory(total=machine, available=None, machine_total=machine)
    assert Host(tmp_path / "missing", meminfo=None).memory() == expected
    assert Host(tmp_path / "garbage", meminfo="garbage\nMemFree: 12 kB\n").memory() == expected


def test_v2_limit_on_own_cgroup(tmp_path: Path) -> None:
    host = Host(tmp_path, cgroup="0::/job_7/step_0\n")
    host.v2(
        "job_7/step_0", memory_max=4 * GiB, memory_current=GiB, memory_stat="anon 1\ninactive_file 536870912\nfile 9"
    )
    # free under the cap: 4 GiB - 1 GiB used + 0.5 GiB reclaimable page cache
    assert host.memory() == HostMemory(
        total=4 * GiB, available=3 * GiB + GiB // 2, machine_total=MACHINE, cgroup_limit=4 * GiB
    )


def test_v2_no_limit_anywhere(tmp_path: Path) -> None:
    host = Host(tmp_path, cgroup="0::/user.slice/session\n")
    host.v2("user.slice/session", memory_max="max", memory_current=GiB)
    host.v2("user.slice", memory_max="max")
    assert host.memory() == HostMemory(total=MACHINE, available=AVAILABLE, machine_total=MACHINE, cgroup_limit=None)


def test_v2_limit_on_ancestor(tmp_path: Path) -> None:
    host = Host(tmp_path, cgroup="0::/job_7/step_0/task_1\n")
    host.v2("job_7/step_0/task_1", memory_max="max", memory_current=GiB)
    host.v2("job_7/step_0", memory_max="max")
    host.v2("job_7", memory_max=2 * GiB, memory_current=GiB // 2)
    assert host.memory() == HostMemory(
        total=2 * GiB, available=GiB + GiB // 2, machine_total=MACHINE, cgroup_limit=2 * GiB
    )


def test_v2_tightest_limit_wins(tmp_path: Path) -> None:
    host = Host(tmp_path, cgroup="0::/outer/inner\n")
    host.v2("outer/inner", memory_max=6 * GiB, memory_current=GiB)
    host.v2("outer", memory_max=3 * GiB, memory_current=GiB)
    memory = host.memory()
    assert (memory.total, memory.cgroup_limit, memory.available) == (3 * GiB, 3 * GiB, 2 * GiB)


def test_v2_limit_at_the_root(tmp_path: Path) -> None:
    # inside a container the namespace makes our cgroup the root of the mounted tree
    host = Host(tmp_path, cgroup="0::/\n")
    host.v2("", memory_max=GiB, memory_current=GiB // 4)
    assert host.memory() == HostMemory(total=GiB, available=3 * GiB // 4, machine_total=MACHINE, cgroup_limit=GiB)


def test_ancestor_with_less_headroom_bounds_available(tmp_path: Path) -> None:
    # The step may use 4 GiB and uses 1 GiB, but the job it belongs to is at 7.5 of its 8 GiB
    # (other steps): only 0.5 GiB more can be allocated before the kernel reclaims or kills.
    host = Host(tmp_path, cgroup="0::/job/step_1\n")
    host.v2("job/step_1", memory_max=4 * GiB, memory_current=GiB)
    host.v2("job", memory_max=8 * GiB, memory_current=7 * GiB + GiB // 2)
    memory = host.memory()
    assert (memory.total, memory.cgroup_limit) == (4 * GiB, 4 * GiB)
    assert memory.available == GiB // 2


def test_equal_limits_on_step_and_job_use_the_job_headroom(tmp_path: Path) -> None:
    # SLURM's usual layout: the job and each step carry the same limit.
    host = Host(tmp_path, cgroup="0::/job/step_1\n")
    host.v2("job/step_1", memory_max=8 * GiB, memory_current=GiB)
    host.v2("job", memory_max=8 * GiB, memory_current=7 * GiB)
    assert host.memory().available == GiB


def test_v2_usage_over_limit_gives_zero(tmp_path: Path) -> None:
    host = Host(tmp_path, cgroup="0::/c\n")
    host.v2("c", memory_max=GiB, memory_current=2 * GiB)
    assert host.memory().available == 0


def test_v2_page_cache_cannot_lift_free_above_limit(tmp_path: Path) -> None:
    host = Host(tmp_path, cgroup="0::/c\n")
    host.v2("c", memory_max=GiB, memory_current=GiB // 2, memory_stat=f"inactive_file {3 * GiB}")
    assert host.memory().available == GiB


def test_limit_above_machine_ram(tmp_path: Path) -> None:
    host = Host(tmp_path, cgroup="0::/c\n")
    host.v2("c", memory_max=64 * GiB, memory_current=GiB)
    assert host.memory() == HostMemory(total=MACHINE, available=AVAILABLE, machine_total=MACHINE, cgroup_limit=64 * GiB)


def test_missing_usage_file_still_caps_available(tmp_path: Path) -> None:
    # Without memory.current nothing is known about usage, but available RAM can never exceed
    # what the limit lets this process hold.
    host = Host(tmp_path, cgroup="0::/c\n")
    host.v2("c", memory_max=4 * GiB)
    memory = host.memory()
    assert (memory.total, memory.cgroup_limit) == (4 * GiB, 4 * GiB)
    assert memory.available == 4 * GiB


def test_missing_meminfo_uses_cgroup_headroom(tmp_path: Path) -> None:
    host = Host(tmp_path, meminfo=None, cgroup="0::/c\n")
    host.v2("c", memory_max=GiB, memory_current=GiB // 4)
    memory = host.memory()
    assert memory.available == 3 * GiB // 4
    assert memory.total == min(memory.machine_total, GiB)


@pytest.mark.parametrize("value", ["garbage", "", "-1", "1.5"])
def test_unreadable_limit_is_ignored(tmp_path: Path, value: str) -> None:
    host = Host(tmp_path, cgroup="0::/c\n")
    host.v2("c", memory_max=value, memory_current=GiB)
    assert host.memory().cgroup_limit is None


def test_v1_limit(tmp_path: Path) -> None:
    cgroup = "12:pids:/slurm/job_5\n11:memory:/slurm/uid_0/job_5\n3:cpu,cpuacct:/slurm/job_5\n"
    host = Host(tmp_path, cgroup=cgroup)
    host.v1(
        "slurm/uid_0/job_5",
        memory_limit_in_bytes=3 * GiB,
        memory_usage_in_bytes=GiB,
        memory_stat=f"cache 1\ntotal_inactive_file {GiB // 2}",
    )
    assert host.memory() == HostMemory(
        total=3 * GiB, available=2 * GiB + GiB // 2, machine_total=MACHINE, cgroup_limit=3 * GiB
    )


def test_v1_no_limit_value(tmp_path: Path) -> None:
    host = Host(tmp_path, cgroup="4:memory:/docker/abc\n")
    host.v1("docker/abc", memory_limit_in_bytes=V1_NO_LIMIT, memory_usage_in_bytes=GiB)
    host.v1("docker", memory_limit_in_bytes=V1_NO_LIMIT)
    host.v1("", memory_limit_in_bytes=V1_NO_LIMIT)
    assert host.memory() == HostMemory(total=MACHINE, available=AVAILABLE, machine_total=MACHINE, cgroup_limit=None)


def test_v1_ancestor_limit_with_combined_controllers(tmp_path: Path) -> None:
    host = Host(tmp_path, cgroup="5:cpuset,memory:/outer/inner\n")
    host.v1("outer/inner", memory_limit_in_bytes=V1_NO_LIMIT, memory_usage_in_bytes=GiB)
    host.v1("outer", memory_limit_in_bytes=2 * GiB, memory_usage_in_bytes=GiB)
    memory = host.memory()
    assert (memory.total, memory.cgroup_limit, memory.available) == (2 * GiB, 2 * GiB, GiB)


def test_v1_files_are_not_read_for_v2_and_back(tmp_path: Path) -> None:
    # a v2 line reads memory.max at the root of the tree; a v1 limit file there is not one
    v2 = Host(tmp_path / "v2", cgroup="0::/c\n")
    write(v2.cgroup_root / "c" / "memory.limit_in_bytes", f"{GiB}\n")
    assert v2.memory().cgroup_limit is None
    v1 = Host(tmp_path / "v1", cgroup="7:memory:/c\n")
    write(v1.cgroup_root / "memory" / "c" / "memory.max", f"{GiB}\n")
    assert v1.memory().cgroup_limit is None


def test_hybrid_v1_and_v2_takes_tightest(tmp_path: Path) -> None:
    host = Host(tmp_path, cgroup="0::/u\n9:memory:/m\n1:name=systemd:/u\n\n")
    host.v2("u", memory_max=6 * GiB, memory_current=GiB)
    host.v1("m", memory_limit_in_bytes=5 * GiB, memory_usage_in_bytes=2 * GiB)
    memory = host.memory()
    assert (memory.total, memory.cgroup_limit, memory.available) == (5 * GiB, 5 * GiB, 3 * GiB)


def test_cgroup_files_missing(tmp_path: Path) -> None:
    # /proc/self/cgroup names a cgroup whose directory does not exist in the tree
    host = Host(tmp_path, cgroup="0::/gone\n")
    assert host.memory() == HostMemory(total=MACHINE, available=AVAILABLE, machine_total=MACHINE)


def test_real_host() -> None:
    memory = host_memory()
    assert 0 < memory.total <= memory.machine_total
    if memory.cgroup_limit is not None:
        assert memory.total == min(memory.machine_total, memory.cgroup_limit)
    else:
        assert memory.total == memory.machine_total
    if memory.available is not None:
        assert 0 <= memory.available <= memory.machine_total

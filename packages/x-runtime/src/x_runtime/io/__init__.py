"""Files, written all-or-nothing: atomic writes, free-space checks, torch and safetensors files.

``atomic`` writes a file or a folder through a temporary name, fsync and rename; ``disk_space``
checks the free space first and turns a full disk into one ``DiskFullError``; ``files`` reads and
writes ``torch.save`` files without running pickled code; ``model_files`` writes and reads
safetensors weights (sharded, ties kept).
"""

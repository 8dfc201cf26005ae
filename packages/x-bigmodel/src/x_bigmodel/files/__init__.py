"""Checkpoint files on disk: which files a checkpoint is, and safetensors read our way.

``safetensors_header`` checks a header exactly as the safetensors library does,
``safetensors_file`` reads tensors straight into their destination or views them in place, and
``checkpoint_files`` resolves a folder, an index or a file into the files to read.
"""

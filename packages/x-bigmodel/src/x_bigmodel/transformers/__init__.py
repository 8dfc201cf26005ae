"""transformers models: ``from_pretrained`` over GPU, CPU and disk, with transformers' own key tables.

``hub_files`` finds a model's files (a folder or the Hub cache), ``key_tables`` builds
transformers' key conversion table for one model, ``key_mapping`` maps checkpoint names with it,
``conversions`` places the tensors transformers converts at load time, and ``pretrained`` is the
user's one call.
"""

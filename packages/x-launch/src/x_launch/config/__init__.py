"""The launch settings: the settings table and its rows, the config file (finding, reading within
bounds, checking, writing), where each effective value comes from, and the environment that carries
the settings to every process. Nothing here starts a process or imports torch.
"""

"""Ports: the small interfaces core code talks through (store, backend, pod agent), each with a real fake."""

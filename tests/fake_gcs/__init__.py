"""A real GCS server on 127.0.0.1 for tests: TensorFlow's gs://, gcsfs and pandas all reach it.

server.py is the test's side (`GcsServer`); __main__.py the server process it
starts, which runs fake-gcs-server (emulator.py) behind the proxy (proxy.py: how
TensorFlow's client is brought there, and why); traffic.py holds the request log
and the fault rules; certs.py makes the throwaway CA. tests/conftest.py has the
fixtures `gcs_server`, `gcs` and `bucket`. Nothing is imported here, so that the
server process loads only what it runs.
"""

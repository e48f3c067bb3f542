"""Live acquisition: detector streams as sources (issue 27, in progress).

:mod:`~quantem_flow.live.dectris_stream` decodes and encodes the DECTRIS
SIMPLON stream v2 (CBOR over ZeroMQ), :mod:`~quantem_flow.live.dectris_receive`
receives a series with deadlines and a report of every missing image, and
:mod:`~quantem_flow.live.dectris_sim` replays frames as a detector would.
The engine side (``qf.live``) and Merlin over TCP are not built yet
(docs/live.md).
"""

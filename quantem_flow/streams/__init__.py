"""Live acquisition: detector streams as sources (issue 27, in progress).

(The package is ``streams`` so that ``qf.live``, the function, is not shadowed
by a subpackage of the same name once imported.)

:mod:`~quantem_flow.streams.dectris_stream` decodes and encodes the DECTRIS
SIMPLON stream v2 (CBOR over ZeroMQ), :mod:`~quantem_flow.streams.dectris_receive`
receives a series with deadlines and a report of every missing image, and
:mod:`~quantem_flow.streams.dectris_sim` replays frames as a detector would.
``qf.live`` (:mod:`~quantem_flow.streams.session`) receives a series into a
file in scan order and queries it while it runs.  Merlin over TCP is not
built yet (docs/live.md).
"""

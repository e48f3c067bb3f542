"""Live acquisition: detector streams as sources (issue 27, in progress; docs/live.md).

(The package is ``streams`` so that ``qf.live``, the function, is not shadowed
by a subpackage of the same name once imported.)

* :mod:`~quantem_flow.streams.dectris_stream`, ``dectris_receive``,
  ``dectris_sim``: the DECTRIS SIMPLON stream v2 (CBOR over ZeroMQ) decoded,
  received with deadlines and a report of every missing image, and replayed;
* :mod:`~quantem_flow.streams.merlin_tcp`: the Merlin readout's TCP data
  socket, received and replayed;
* :mod:`~quantem_flow.streams.session`: ``qf.live``, a series received into a
  file in scan order and queried while it runs (optionally kept as HDF5 with
  the chunks as received).
"""

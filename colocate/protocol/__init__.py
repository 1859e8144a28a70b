"""Every message colocate's daemons, jobs and clients exchange: the one place for the wire contract.

``from colocate import protocol as P`` gives every message class, the codec (``P.encode``, ``P.decode``,
``P.to_wire``, ``P.from_wire``, JSON for debugging), ``P.PROTOCOL_VERSION`` and the error codes.

* ``codec``: field rules, the ``Message`` base, version, ``ProtocolError``, ``Error`` and the codec;
* ``job``: the job <-> node link and the node's operator endpoint (``colocate ctl``/``top``);
* ``cluster``: the node <-> scheduler link (and the rules of the client <-> scheduler requests);
* ``client``: the client <-> scheduler requests and the views they carry.

Error codes (``Error.code``, the one list: ``ERROR_CODES``):
  ``malformed``     not a msgpack/JSON map, too big, no type
  ``version``       another protocol version, or none
  ``unknown_type``  a type this protocol does not have
  ``invalid``       missing, extra, ill-typed or out-of-range fields (or an invalid request, e.g. a job
                    spec that can never be placed)
  ``forbidden``     a valid message the receiving endpoint does not accept, one speaking for a job or
                    node the connection is not registered as, or one the sender's key does not allow
                    (a hello as another node, or for a node id another live connection holds; a user's
                    key saying hello; cancelling another user's job without an operator's key)
  ``rejected``      a registration the node refuses for good (GPU taken by a guaranteed job, job id bound
                    to another token or process); the job must not register again
  ``unknown_job``   a message naming a job (or worker) the receiver does not know (e.g. after a restart):
                    a job registers again
  ``unknown_node``  a node message from a node the scheduler does not know: the node registers again
  ``not_found``     a client asked about a job that does not exist
  ``unavailable``   the receiver cannot act now and did nothing (the scheduler cannot write its journal,
                    or its policy failed on the request and was rebuilt from the journal): try again later
"""

from colocate.protocol.client import *  # noqa: F403
from colocate.protocol.cluster import *  # noqa: F403
from colocate.protocol.codec import *  # noqa: F403
from colocate.protocol.codec import _SPECS  # noqa: F401  (tests walk every message's field rules)
from colocate.protocol.job import *  # noqa: F403

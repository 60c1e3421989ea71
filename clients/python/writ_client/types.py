"""The wire types a host sends and gets back: runs, commands, decisions, proposals, a run's
steps and a chat session's events (`isinstance(event, TurnEnded)`). They are the SDK's own
copy of Writ's schemas, so they are the classes every client method returns."""

from writ_client._wire import api, governance, host, planner, reads, sessions
from writ_client._wire.api import *  # noqa: F403
from writ_client._wire.governance import *  # noqa: F403
from writ_client._wire.host import *  # noqa: F403
from writ_client._wire.planner import *  # noqa: F403
from writ_client._wire.reads import *  # noqa: F403
from writ_client._wire.sessions import *  # noqa: F403

__all__ = sorted(
    {
        *api.__all__,
        *governance.__all__,
        *host.__all__,
        *planner.__all__,
        *reads.__all__,
        *sessions.__all__,
    }
)

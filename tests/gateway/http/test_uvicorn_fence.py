"""The fence around uvicorn's internals in services/gateway/http/protocol.py: the installed uvicorn
has what the corked protocol overrides and reads, and an upgrade that removes any of it fails
here, naming it."""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from services.gateway.http import guard, protocol
from shared import private_internals


def test_the_installed_uvicorn_has_what_the_protocol_relies_on():
    assert private_internals.missing(protocol.UVICORN_RELIED_ON, protocol.UVICORN_BEHAVIOUR) == []


def test_the_installed_uvicorn_has_what_the_guard_relies_on():
    assert private_internals.missing(guard.UVICORN_RELIED_ON, ()) == []


def test_a_uvicorn_without_it_is_named():
    relied_on = {**protocol.UVICORN_RELIED_ON, RequestResponseCycle: ("more_body", "_renamed_later")}
    behaviour = (*protocol.UVICORN_BEHAVIOUR, (HttpToolsProtocol.on_headers_complete, "self._start_task(cycle)"))
    assert private_internals.missing(relied_on, behaviour) == [
        "uvicorn.protocols.http.httptools_impl.RequestResponseCycle._renamed_later",
        "uvicorn.protocols.http.httptools_impl.HttpToolsProtocol.on_headers_complete no longer does "
        "`self._start_task(cycle)`",
    ]

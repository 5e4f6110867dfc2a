"""Tokens cannot outlive or outrank their maker (issue 24 item 2): a token made through the API
expires no later than the token that made it, has at most its role and scope, and stops working
when its maker (or any maker up the chain) is revoked or expires."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from fencepost.api import ApiConfig
from fencepost.client import Client
from fencepost.core.config import Settings
from tests.test_api import Api, _make_api


@pytest.fixture
async def api(settings: Settings, client: Client) -> AsyncIterator[Api]:
    async for a in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        yield a


async def _make(api: Api, who: str, body: dict[str, object]) -> tuple[int, str, dict[str, object]]:
    r = await api.req("POST", "/v1/tokens", who, json=body)
    assert r.status_code == 201, r.text
    out = r.json()
    return out["id"], out["secret"], out


def _as(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def test_a_token_made_by_a_short_lived_token_expires_no_later_than_it(api: Api) -> None:
    """The issue's reproduction: an admin token with expires_in 60 made an admin token that never expired."""
    pid, psecret, parent = await _make(api, "admin", {"role": "admin", "expires_in": 60})
    r = await api.req("POST", "/v1/tokens", headers=_as(psecret), json={"role": "admin"})
    assert r.status_code == 201, r.text
    child = r.json()
    assert child["expires_at"] is not None and child["expires_at"] <= parent["expires_at"], (child, parent)
    assert child["parent_id"] == pid
    r = await api.req("POST", "/v1/tokens", headers=_as(psecret), json={"role": "admin", "expires_in": 3600})
    assert r.status_code == 422 and r.json()["field"] == "expires_in", r.text


async def test_revoking_a_token_revokes_every_token_it_made(api: Api) -> None:
    """The issue's reproduction: revoking the parent left the child answering 200 on /v1/me."""
    pid, psecret, _ = await _make(api, "admin", {"role": "admin"})
    r = await api.req("POST", "/v1/tokens", headers=_as(psecret), json={"role": "admin"})
    cid, csecret = r.json()["id"], r.json()["secret"]
    r = await api.req("POST", "/v1/tokens", headers=_as(csecret), json={"role": "operator", "queues": ["tq"]})
    gid, gsecret = r.json()["id"], r.json()["secret"]
    for s in (psecret, csecret, gsecret):
        assert (await api.req("GET", "/v1/me", headers=_as(s))).status_code == 200
    r = await api.req("DELETE", f"/v1/tokens/{pid}?reason=left", "admin")
    assert r.status_code == 200, r.text
    for s in (psecret, csecret, gsecret):
        assert (await api.req("GET", "/v1/me", headers=_as(s))).status_code == 401, "a made token outlived its maker"
    listed = {t["id"]: t for t in (await api.req("GET", "/v1/tokens", "admin")).json()}
    assert listed[cid]["revoked_at"] and listed[gid]["revoked_at"]


async def test_a_token_is_refused_once_its_maker_is_revoked_even_if_its_row_is_not(api: Api, client: Client) -> None:
    """Checked at authentication through the chain, not only by the cascade at revoke time."""
    pid, psecret, _ = await _make(api, "admin", {"role": "admin"})
    r = await api.req("POST", "/v1/tokens", headers=_as(psecret), json={"role": "producer"})
    csecret = r.json()["secret"]
    await client.stores.db.pool.execute(  # type: ignore[union-attr]
        "UPDATE api_tokens SET revoked_at = now() WHERE id = $1", pid)
    assert (await api.req("GET", "/v1/me", headers=_as(csecret))).status_code == 401


async def test_a_scoped_token_cannot_make_a_token_beyond_its_scope(api: Api) -> None:
    _, ssecret, _ = await _make(api, "admin", {"role": "admin", "queues": ["tq"]})
    r = await api.req("POST", "/v1/tokens", headers=_as(ssecret), json={"role": "operator", "queues": ["other"]})
    assert r.status_code == 403, r.text
    r = await api.req("POST", "/v1/tokens", headers=_as(ssecret), json={"role": "operator"})
    assert r.status_code == 201 and r.json()["queues"] == ["tq"], r.text

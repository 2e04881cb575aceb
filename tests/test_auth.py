"""Tokens and names alone: digests on disk, namespace scoping, bearer metadata, secret files."""
import hashlib
import json
import stat

import pytest

from kvedge.common.net.auth import (ALL, InvalidName, PermissionDenied, Principal, TokenStore,
                                Unauthenticated, bearer, check_name, write_secret)
from kvedge.common.errors import InvalidRequest, KvedgeError


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def store(tmp_path):
    return TokenStore(tmp_path / "state" / "tokens.json")


def test_issue_stores_only_the_digest(store):
    token = store.issue("alice", ["tenant-a"])
    raw = store.path.read_text()
    assert token.startswith("kve_") and token not in raw
    assert json.loads(raw) == {hashlib.sha256(token.encode()).hexdigest():
                               {"name": "alice", "namespaces": ["tenant-a"]}}
    assert mode(store.path) == 0o600
    lock = store.path.with_name("tokens.json.lock")  # empty: only its flock matters
    assert mode(lock) == 0o600 and lock.stat().st_size == 0
    assert not [p for p in store.path.parent.iterdir() if p not in (store.path, lock)]  # no temp


def test_check_returns_the_principal_of_each_token(store):
    a = store.issue("alice", ["tenant-b", "tenant-a", "tenant-a"])
    b = store.issue("bob", ["tenant-b"])
    assert a != b
    assert store.check(a) == Principal("alice", ("tenant-a", "tenant-b"))
    assert store.check(b) == Principal("bob", ("tenant-b",))
    assert TokenStore(store.path).check(a).name == "alice"  # a fresh reader of the same file


@pytest.mark.parametrize("token", [None, "", "kve_not-a-token", "kve_"])
def test_missing_or_unknown_tokens_are_unauthenticated(store, token):
    store.issue("alice", ["tenant-a"])
    with pytest.raises(Unauthenticated):
        store.check(token)


def test_a_store_without_a_file_knows_no_token(tmp_path):
    with pytest.raises(Unauthenticated, match="unknown token"):
        TokenStore(tmp_path / "absent.json").check("kve_x")


def test_the_digest_itself_is_not_a_token(store):
    token = store.issue("alice", ["tenant-a"])
    with pytest.raises(Unauthenticated):
        store.check(hashlib.sha256(token.encode()).hexdigest())


def test_a_token_reads_only_its_namespaces(store):
    who = store.check(store.issue("alice", ["tenant-a"]))
    assert who.may_read("tenant-a") and not who.may_read("tenant-b")
    who.require("tenant-a")
    with pytest.raises(PermissionDenied, match="'alice'.*'tenant-b'"):
        who.require("tenant-b")


def test_the_wildcard_reads_every_namespace(store):
    who = store.check(store.issue("admin", [ALL]))
    assert ALL == "*"
    for ns in ("default", "tenant-a", "anything"):
        assert who.may_read(ns)
        who.require(ns)


def test_a_token_for_no_namespace_reads_nothing(store):
    who = store.check(store.issue("nobody", []))
    assert not who.may_read("default")
    with pytest.raises(PermissionDenied):
        who.require("default")


def test_issue_refuses_bad_namespace_names_and_writes_nothing(store):
    with pytest.raises(InvalidName):
        store.issue("eve", ["tenant-a", "../etc"])
    assert not store.path.exists()


def test_auth_errors_are_named_kvedge_errors():
    assert issubclass(Unauthenticated, KvedgeError) and issubclass(PermissionDenied, KvedgeError)
    assert issubclass(InvalidName, InvalidRequest)


@pytest.mark.parametrize("name", ["default", "tenant-a", "KB_2", "a", "v1.2", "0start",
                                  "x" * 64, "a..b"])
def test_check_name_accepts(name):
    assert check_name("knowledge base", name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "a\\b", "/abs", ".hidden",
                                  "-flag", "_x", "x" * 65, "with space", "tab\tx", "nul\0",
                                  "é", "a:b", "*", None, 7])
def test_check_name_refuses(name):
    with pytest.raises(InvalidName, match="invalid namespace name"):
        check_name("namespace", name)


def test_check_name_refuses_a_trailing_newline():
    with pytest.raises(InvalidName):
        check_name("namespace", "tenant-a\n")


@pytest.mark.parametrize("metadata, token", [
    ([("authorization", "Bearer kve_abc")], "kve_abc"),
    ((("user-agent", "grpc"), ("authorization", "Bearer kve_abc")), "kve_abc"),
    ([("authorization", "Basic dXNlcg==")], None),
    ([("authorization", "kve_abc")], None),
    ([("x-authorization", "Bearer kve_abc")], None),
    ([], None),
    (None, None),
])
def test_bearer_reads_the_authorization_metadata(metadata, token):
    assert bearer(metadata) == token


def test_bearer_takes_the_first_bearer_entry():
    md = [("authorization", "Basic x"), ("authorization", "Bearer one"),
          ("authorization", "Bearer two")]
    assert bearer(md) == "one"


def test_write_secret_is_owner_only(tmp_path):
    path = tmp_path / "deep" / "er" / "admin.token"
    write_secret(path, "kve_secret")
    assert path.read_text() == "kve_secret\n"
    assert mode(path) == 0o600
    write_secret(path, "kve_new")  # overwrites, does not append
    assert path.read_text() == "kve_new\n" and mode(path) == 0o600


def test_write_secret_tightens_an_existing_file(tmp_path):
    path = tmp_path / "edge.token"
    path.write_text("old\n")
    path.chmod(0o644)
    write_secret(path, "kve_secret")
    assert mode(path) == 0o600 and path.read_text() == "kve_secret\n"
    assert [p.name for p in tmp_path.iterdir()] == ["edge.token"]  # no temp file left


def test_tokens_issued_at_once_are_all_kept(tmp_path):
    """Read-modify-write of tokens.json from many threads (and processes: the same flock)."""
    from concurrent.futures import ThreadPoolExecutor

    path = tmp_path / "state" / "tokens.json"
    with ThreadPoolExecutor(8) as pool:
        tokens = list(pool.map(lambda i: TokenStore(path).issue(f"t{i}", ["ns"]), range(24)))
    store = TokenStore(path)
    assert sorted(store.check(t).name for t in tokens) == sorted(f"t{i}" for i in range(24))

"""Security end to end: TLS and mutual TLS with certificates made here, API keys, model permissions,
rate limits on a fake clock, key-file reloads (in process and by SIGHUP), and what logs and metrics show.
Real servers on loopback ports; no timing luck."""
import asyncio
import concurrent.futures as cf
import datetime as dt
import io
import ipaddress
import json
import logging
import signal
import time
import urllib.request
from types import SimpleNamespace

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from google.rpc import code_pb2, error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status
from benchmarks.harness import free_port
from tests.serving import ServerThread, start_subprocess, wait_process_serving

from client import AsyncTranslatorClient, TranslatorClient
from client.__main__ import main as client_main
from client.client import _pause
from client.loadgen.__main__ import main as loadgen_main
from protos.nmt.v1 import translator_pb2 as pb
from server.config import ServerConfig
from server.security import auth, keys
from server.security.auth import CALLER_KEY_ID, KeyLabels, retry_metadata
from server.security.ratelimit import Cost, RateLimiter, Refusal

MODEL = "multi30k-en-de-small"
TEXT = "A man is riding a bike."


# -- a private PKI, made at test time ------------------------------------------------------

def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _certificate(subject: str, key, issuer: x509.Name, issuer_key, *, ca: bool = False, server: bool = False):
    now = dt.datetime.now(dt.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer).public_key(key.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
         .not_valid_after(now + dt.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                          content_commitment=False, key_encipherment=False, data_encipherment=False,
                                          key_agreement=False, encipher_only=False, decipher_only=False),
                            critical=True)
    elif server:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                         x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                            critical=False)
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    else:
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _write(folder, name: str, key, cert) -> tuple[str, str]:
    key_path, cert_path = folder / f"{name}.key", folder / f"{name}.pem"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(cert_path), str(key_path)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    out = {}
    for ca_name in ("ca", "other_ca"):
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = _certificate(f"test {ca_name}", ca_key, _name(f"test {ca_name}"), ca_key, ca=True)
        out[ca_name], _ = _write(folder, ca_name, ca_key, ca_cert)
        for leaf, server in (("server", True), ("client", False)):
            key = ec.generate_private_key(ec.SECP256R1())
            cert = _certificate(f"{leaf} of {ca_name}", key, ca_cert.subject, ca_key, server=server)
            prefix = "" if ca_name == "ca" else "rogue_"
            out[f"{prefix}{leaf}_cert"], out[f"{prefix}{leaf}_key"] = _write(folder, prefix + leaf, key, cert)
    return SimpleNamespace(**out)


# -- API keys --------------------------------------------------------------------------------

KEYS = {name: keys.new_key() for name in ("alice", "bob", "carol", "dave", "erin")}


def key_file(path, **fields) -> str:
    """One line per key: the names in `fields` with their extra settings."""
    lines = ["# test keys", ""] + [keys.file_line(name, KEYS[name], **spec) for name, spec in fields.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    path = key_file(tmp_path_factory.mktemp("keys") / "keys.txt", alice={}, bob={"models": ["another-model"]},
                    carol={"models": [MODEL], "rpm": 2}, dave={"input_tpm": 30})
    srv = ServerThread(api_keys_file=path).start()
    srv.clock = srv.app.security.limiter.clock = FakeClock()
    yield srv
    srv.stop()


def code_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details()


def client(srv, key=None, **kw) -> TranslatorClient:
    return TranslatorClient(srv.target, timeout=30, retries=0, api_key=KEYS.get(key, key), **kw)


def test_no_key_or_a_wrong_key_is_unauthenticated(keyed):
    for key in (None, "nmt_not-a-key-of-this-server"):
        with client(keyed, key) as c:
            for call in (lambda: c.translate([TEXT]), c.list_models, lambda: c.embed(["A dog."]),
                         lambda: list(c.translate_stream(TEXT))):
                code, message = code_of(call)
                assert code == grpc.StatusCode.UNAUTHENTICATED, message
                assert ("invalid" if key else "missing") in message
    with client(keyed) as c:  # a scheme other than Bearer is no key either
        basic = (("authorization", f"Basic {KEYS['alice']}"),)
        code, _ = code_of(lambda: c.stub.ListModels(pb.ListModelsRequest(), timeout=10, metadata=basic))
        assert code == grpc.StatusCode.UNAUTHENTICATED
    # Refused before the servicer, yet counted like every other RPC.
    assert keyed.settled_metric("nmt_requests_total", 2, rpc="Translate", code="UNAUTHENTICATED") == 2


def test_allowed_key_is_served_and_the_handler_sees_its_key_id(keyed, monkeypatch):
    seen = []
    service = keyed.app.service
    inner = service._guard

    async def spying(rpc, request, context, work):
        seen.append((rpc, CALLER_KEY_ID.get()))
        return await inner(rpc, request, context, work)
    monkeypatch.setattr(service, "_guard", spying)
    with client(keyed, "alice") as c:
        assert c.translate([TEXT]).translations[0].hypotheses[0].text
        assert "".join(m.delta for m in c.translate_stream(TEXT))
        assert c.list_models().default_model == MODEL
    with client(keyed, "carol") as c:  # carol may use the default model (the request names none)
        keyed.clock.now += 60
        assert c.translate([TEXT], model="").model == MODEL
    assert seen == [("Translate", "alice"), ("TranslateStream", "alice"), ("ListModels", "alice"),
                    ("Translate", "carol")]
    assert CALLER_KEY_ID.get() == ""  # the variable lives in each RPC's own context


def test_a_model_the_key_may_not_use_is_permission_denied(keyed):
    with client(keyed, "bob") as c:
        for call in (lambda: c.translate([TEXT]), lambda: c.translate([TEXT], model=MODEL),
                     lambda: c.embed(["A dog."]), lambda: list(c.translate_stream(TEXT))):
            code, message = code_of(call)
            assert code == grpc.StatusCode.PERMISSION_DENIED and "'bob'" in message and MODEL in message
        # An unknown model is denied too: a restricted key learns nothing about what else is served.
        assert code_of(lambda: c.translate([TEXT], model="secret-model"))[0] == grpc.StatusCode.PERMISSION_DENIED
        assert c.list_models().models  # no model named: allowed
    with client(keyed, "alice") as c:  # an unrestricted key gets the service's own answer
        assert code_of(lambda: c.translate([TEXT], model="secret-model"))[0] == grpc.StatusCode.NOT_FOUND
    assert keyed.settled_metric("nmt_auth_requests_total", 5, key_id="bob", result="permission_denied") == 5


def retry_info(err: grpc.RpcError) -> float:
    status = rpc_status.from_call(err)
    assert status is not None and status.code == code_pb2.RESOURCE_EXHAUSTED
    for detail in status.details:
        info = error_details_pb2.RetryInfo()
        if detail.Unpack(info):
            return info.retry_delay.ToTimedelta().total_seconds()
    raise AssertionError("no RetryInfo in the status details")


def test_requests_per_minute_limit_answers_resource_exhausted_with_retry_info(keyed):
    keyed.clock.now += 600  # a full bucket, whatever ran before
    with client(keyed, "carol") as c:
        c.list_models()
        c.list_models()
        with pytest.raises(grpc.RpcError) as err:
            c.translate([TEXT])
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "rpm 2/min" in err.value.details()
        assert retry_info(err.value) == 30.0  # rpm=2 refills one request per 30 s; the clock stood still
        keyed.clock.now += 29.9
        assert code_of(c.list_models)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
        keyed.clock.now += 0.1
        assert c.translate([TEXT]).translations  # exactly when it said
    with TranslatorClient(keyed.target, timeout=5, retries=3, api_key=KEYS["carol"]) as c:
        t0 = time.monotonic()  # a wait past the deadline is not slept: the error comes at once
        assert code_of(c.list_models)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert time.monotonic() - t0 < 3
    assert keyed.settled_metric("nmt_auth_requests_total", 3, key_id="carol", result="rate_limited") == 3


def test_token_limit_charges_an_estimate_then_the_reported_counts(keyed):
    keyed.clock.now += 600
    with client(keyed, "dave") as c:
        final = list(c.translate_stream(TEXT))[-1]  # estimated ceil(23/4)+1 = 7 input tokens, then settled
        used = final.input_tokens
        assert 4 < used <= 30
        long_text = "x" * 100  # estimated 26 input tokens
        with pytest.raises(grpc.RpcError) as err:
            c.translate([long_text])
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "input_tpm 30/min" in err.value.details()
        # 30 - used left; 26 needed; refill 0.5 token/s.
        assert retry_info(err.value) == pytest.approx((26 - (30 - used)) / 0.5, abs=1e-3)


def test_retry_info_is_honoured_by_the_client_library_when_it_fits_the_deadline():
    refusal = Refusal("rpm", 60, 0.25)
    trailing = retry_metadata("m", refusal, "k")
    err = SimpleNamespace(code=lambda: grpc.StatusCode.RESOURCE_EXHAUSTED, trailing_metadata=lambda: trailing)
    assert _pause(err, 0, 0.1) == 0.25
    full_queue = SimpleNamespace(code=lambda: grpc.StatusCode.RESOURCE_EXHAUSTED, trailing_metadata=lambda: ())
    assert _pause(full_queue, 0, 0.1) is None


def test_rate_limiter_buckets():
    clock = FakeClock()
    lim = RateLimiter(clock)
    key = keys.ApiKey("k", b"0" * 32, limits=keys.Limits(tpm=60))
    assert lim.admit(key, Cost(1, 100, 0)) is None  # bigger than the bucket: admitted when full, then in debt
    refusal = lim.admit(key, Cost(1, 1, 0))
    assert refusal.limit == "tpm" and refusal.retry_after == 41.0  # (1 - (60 - 100)) tokens at 1/s
    lim.settle(key, Cost(1, 100, 0), Cost(1, 10, 0))  # it really used 10: 90 refunded
    assert lim.admit(key, Cost(1, 50, 0)) is None
    clock.now += 1e6
    assert lim.admit(key, Cost(1, 60, 0)) is None  # refilled to the cap, never beyond


def test_health_and_reflection_are_open_by_default(keyed):
    with grpc.insecure_channel(keyed.target) as ch:
        assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10).status == \
            health_pb2.HealthCheckResponse.SERVING
        assert "nmt.v1.Translator" in list_services(ch)


def list_services(channel, metadata=None) -> list[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                        timeout=10, metadata=metadata)
    return [s.name for r in replies for s in r.list_services_response.service]


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    path = key_file(tmp_path_factory.mktemp("strict") / "keys.txt", alice={}, bob={}, carol={})
    srv = ServerThread(api_keys_file=path, auth_health_and_reflection=True, auth_metrics_max_keys=2).start()
    yield srv
    srv.stop()


def test_the_flag_closes_health_and_reflection(strict):
    with client(strict) as c:
        assert code_of(c.health)[0] == grpc.StatusCode.UNAUTHENTICATED
    with client(strict, "alice") as c:
        assert c.health() == "SERVING"
    with grpc.insecure_channel(strict.target) as ch:
        assert code_of(lambda: list_services(ch))[0] == grpc.StatusCode.UNAUTHENTICATED
        auth = (("authorization", f"Bearer {KEYS['alice']}"),)
        assert "grpc.health.v1.Health" in list_services(ch, auth)


def test_key_id_labels_are_capped(strict):
    for name in ("alice", "bob", "carol"):
        with client(strict, name) as c:
            c.list_models()
    assert strict.metric("nmt_auth_requests_total", key_id="bob", result="ok") >= 1
    assert strict.metric("nmt_auth_requests_total", key_id="other", result="ok") >= 1
    assert 'key_id="carol"' not in strict.metrics_text()
    labels = KeyLabels(1)
    assert [labels(k) for k in ("a", "b", "a", "")] == ["a", "other", "a", ""]


def test_keys_never_appear_in_logs_or_metrics(keyed, caplog):
    wrong = "nmt_wrong-" + "z" * 30
    with caplog.at_level(logging.DEBUG):
        auth_throttle = keyed.app.security.interceptor.throttle
        auth_throttle.last.clear()  # log this round's refusals even if earlier tests just logged some
        outcomes = {}
        for key in ("alice", "bob", wrong, None):
            with client(keyed, key) as c:
                try:
                    outcomes[key] = c.translate([TEXT]).translations[0].hypotheses[0].text and "OK"
                except grpc.RpcError as e:
                    outcomes[key] = e.code().name
    # alice may use the default model; bob's key names another model; a wrong key or none is refused.
    assert outcomes == {"alice": "OK", "bob": "PERMISSION_DENIED", wrong: "UNAUTHENTICATED",
                        None: "UNAUTHENTICATED"}, outcomes
    text = keyed.metrics_text()
    assert 'key_id="alice"' in text and 'key_id="bob",result="permission_denied"' in text
    logged = caplog.text
    assert "invalid API key" in logged and "key bob" in logged
    for secret in [*KEYS.values(), wrong, keys.digest_of(KEYS["alice"]).hex()]:
        assert secret not in logged and secret not in text


def reload_in_loop(srv) -> bool:
    done: cf.Future = cf.Future()
    srv.loop.call_soon_threadsafe(lambda: done.set_result(srv.app.security.reload()))
    return done.result(10)


def test_reload_swaps_keys_and_a_bad_file_keeps_the_old_ones(tmp_path, caplog):
    path = tmp_path / "keys.txt"
    key_file(path, alice={})
    srv = ServerThread(api_keys_file=str(path)).start()
    try:
        with client(srv, "alice") as a, client(srv, "erin") as e:
            assert a.list_models().models
            assert code_of(e.list_models)[0] == grpc.StatusCode.UNAUTHENTICATED
            key_file(path, erin={"models": [MODEL]})
            assert reload_in_loop(srv)
            assert e.list_models().models
            assert code_of(a.list_models)[0] == grpc.StatusCode.UNAUTHENTICATED
            path.write_text(path.read_text() + "zed 1234 rpm=fast\n")
            with caplog.at_level(logging.ERROR):
                assert not reload_in_loop(srv)
            assert e.list_models().models  # the old table stays
            assert "line 4" in caplog.text and "keeping the 1 keys" in caplog.text
            assert srv.metric("nmt_auth_key_reloads_total", result="error") == 1
            assert srv.metric("nmt_auth_keys") == 1
    finally:
        srv.stop()


def test_sighup_reloads_the_key_file_of_a_server_process(tmp_path):
    path = tmp_path / "keys.txt"
    key_file(path, alice={})
    port, mport = free_port(), free_port()
    proc = start_subprocess(port, mport, "--api-keys-file", str(path), "--warmup", "false")
    try:
        with TranslatorClient(f"127.0.0.1:{port}", timeout=30, retries=0, api_key=KEYS["alice"]) as a, \
                TranslatorClient(f"127.0.0.1:{port}", timeout=30, retries=0, api_key=KEYS["erin"]) as e:
            wait_process_serving(a, proc)  # health is open: no key needed, but sending one is fine
            assert a.translate([TEXT]).translations
            key_file(path, erin={})
            proc.send_signal(signal.SIGHUP)
            end = time.monotonic() + 20
            while time.monotonic() < end:
                try:
                    e.list_models()
                    break
                except grpc.RpcError:
                    time.sleep(0.1)
            assert e.list_models().models
            assert code_of(a.list_models)[0] == grpc.StatusCode.UNAUTHENTICATED
            path.write_text("erin " + KEYS["erin"] + "\n")  # a plain key where its hash belongs
            proc.send_signal(signal.SIGHUP)
            end = time.monotonic() + 20
            while time.monotonic() < end and 'result="error"' not in scrape(mport, "nmt_auth_key_reloads_total"):
                time.sleep(0.1)
            assert e.list_models().models  # still the last good table
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0
    assert "reloaded --api-keys-file" in output and "line 1" in output and "never keys" in output
    assert KEYS["erin"] not in output and KEYS["alice"] not in output


def scrape(port: int, name: str) -> str:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return "\n".join(line for line in text.splitlines() if line.startswith(name))


# -- TLS and mutual TLS --------------------------------------------------------------------

@pytest.fixture(scope="module")
def tls_server(pki):
    srv = ServerThread(tls_cert_file=pki.server_cert, tls_key_file=pki.server_key, metrics_host="127.0.0.1").start()
    yield srv
    srv.stop()


def test_tls_serves_and_refuses_plaintext(tls_server, pki):
    with TranslatorClient(tls_server.target, timeout=30, retries=0, ca_file=pki.ca) as c:
        assert c.translate([TEXT]).translations[0].hypotheses[0].text
        assert c.health() == "SERVING"
    with TranslatorClient(tls_server.target, timeout=30, retries=0, ca_file=pki.ca, server_name="localhost") as c:
        assert c.list_models().models
    with TranslatorClient(tls_server.target, timeout=10, retries=0) as c:  # plaintext on a TLS-only port
        assert code_of(c.list_models)[0] == grpc.StatusCode.UNAVAILABLE
        assert code_of(c.health)[0] == grpc.StatusCode.UNAVAILABLE
    with TranslatorClient(tls_server.target, timeout=10, retries=0, ca_file=pki.other_ca) as c:  # untrusted cert
        assert code_of(c.list_models)[0] == grpc.StatusCode.UNAVAILABLE
    # /metrics answers on --metrics-host
    assert tls_server.settled_metric("nmt_requests_total", 1, rpc="Translate", code="OK") == 1


@pytest.fixture(scope="module")
def mtls_server(pki, tmp_path_factory):
    path = key_file(tmp_path_factory.mktemp("mtls") / "keys.txt", alice={})
    srv = ServerThread(tls_cert_file=pki.server_cert, tls_key_file=pki.server_key, tls_client_ca_file=pki.ca,
                       api_keys_file=path).start()
    yield srv
    srv.stop()


def test_mutual_tls_needs_a_client_certificate_from_the_ca(mtls_server, pki):
    good = dict(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)
    with client(mtls_server, "alice", **good) as c:
        assert c.translate([TEXT]).translations
    with client(mtls_server, "alice", ca_file=pki.ca) as c:  # no client certificate
        assert code_of(c.list_models)[0] == grpc.StatusCode.UNAVAILABLE
    with client(mtls_server, "alice", ca_file=pki.ca, cert_file=pki.rogue_client_cert,
                key_file=pki.rogue_client_key) as c:  # a certificate from another CA
        assert code_of(c.list_models)[0] == grpc.StatusCode.UNAVAILABLE
    with client(mtls_server, None, **good) as c:  # a good certificate is not an API key
        assert code_of(c.list_models)[0] == grpc.StatusCode.UNAUTHENTICATED

    async def async_call():
        async with AsyncTranslatorClient(mtls_server.target, timeout=30, retries=0, api_key=KEYS["alice"],
                                         **good) as c:
            return (await c.translate([TEXT])).translations[0].hypotheses[0].text, await c.health()
    text, health = asyncio.run(async_call())
    assert text and health == "SERVING"


def test_cli_and_load_generator_speak_mtls_with_a_key(mtls_server, pki, tmp_path, capsys):
    flags = ["--ca-file", pki.ca, "--cert-file", pki.client_cert, "--key-file", pki.client_key]
    assert client_main(["--target", mtls_server.target, *flags, "--api-key", KEYS["alice"], "models"]) == 0
    assert MODEL in capsys.readouterr().out
    assert client_main(["--target", mtls_server.target, *flags, "models"]) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err
    src, out = tmp_path / "src.en", tmp_path / "run.json"
    src.write_text(TEXT + "\n")
    assert loadgen_main(["--target", mtls_server.target, *flags, "--api-key", KEYS["alice"], "--src-file", str(src),
                         "--rpc", "unary", "--concurrency", "1", "--requests", "2", "--warmup", "0",
                         "--max-output-tokens", "8", "--quiet", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["levels"][0]["codes"] == {"OK": 2}


# -- start-up checks and the key tool --------------------------------------------------------

def test_bad_security_settings_are_listed_at_start_up(pki, tmp_path):
    def problems(**kw) -> str:
        return " | ".join(ServerConfig(**kw).problems())
    assert "go together" in problems(tls_cert_file=pki.server_cert)
    assert "go together" in problems(tls_key_file=pki.server_key)
    assert "needs --tls-cert-file" in problems(tls_client_ca_file=pki.ca)
    assert "no such file" in problems(tls_cert_file=str(tmp_path / "nope.pem"), tls_key_file=pki.server_key)
    assert "matching private key" in problems(tls_cert_file=pki.server_cert, tls_key_file=pki.client_key)
    (tmp_path / "empty.pem").write_text("")
    assert "--tls-client-ca-file" in problems(tls_cert_file=pki.server_cert, tls_key_file=pki.server_key,
                                              tls_client_ca_file=str(tmp_path / "empty.pem"))
    assert "--api-keys-file" in problems(auth_health_and_reflection=True)
    bad = tmp_path / "keys.txt"
    bad.write_text("# comment\n\nok " + "a" * 64 + "\nok " + "b" * 64 + "\nx\nfoo " + "c" * 64 + " rpm=-1 nope=1\n"
                   "bar plainsecret\n")
    found = problems(api_keys_file=str(bad))
    for expected in ("line 4: key id 'ok' already used on line 3", "line 5: expected", "line 6: rpm must be",
                     "line 6: unknown field 'nope'", "line 7: the second field must be the key's SHA-256"):
        assert expected in found, found
    assert "plainsecret" not in found
    assert ServerConfig(tls_cert_file=pki.server_cert, tls_key_file=pki.server_key, tls_client_ca_file=pki.ca,
                        api_keys_file=key_file(tmp_path / "good.txt", alice={"rpm": 5})).problems() == []


def test_key_tool_prints_a_key_once_and_its_line(capsys, monkeypatch, tmp_path):
    assert keys.main(["new", "zed", "--models", f"{MODEL},other", "--rpm", "5", "--output-tpm", "100"]) == 0
    key, line = capsys.readouterr().out.splitlines()
    assert key.startswith("nmt_") and key not in line
    (found,) = keys.parse_key_file(line).keys
    assert keys.parse_key_file(line).find(key) == found and found.key_id == "zed"
    assert found.models == {MODEL, "other"} and found.limits == keys.Limits(rpm=5, output_tpm=100)
    assert keys.parse_key_file(line).find(key + "x") is None
    monkeypatch.setattr("sys.stdin", io.StringIO(key + "\n"))
    assert keys.main(["hash", "zed"]) == 0
    assert capsys.readouterr().out.split()[:2] == line.split()[:2]
    (tmp_path / "k.txt").write_text(line + "\n")
    assert keys.main(["check", str(tmp_path / "k.txt")]) == 0 and "1 keys, OK" in capsys.readouterr().out


def test_bearer_parsing():
    assert auth.bearer_key((("authorization", "Bearer abc"),)) == "abc"
    assert auth.bearer_key((("authorization", "bearer  abc "),)) == "abc"
    assert auth.bearer_key((("authorization", "Basic abc"),)) is None
    assert auth.bearer_key((("authorization", "Bearer"),)) is None
    assert auth.bearer_key((("x-other", "Bearer abc"),)) is None


def test_the_http_port_speaks_only_tls_with_the_same_certificates_and_keys(mtls_server, pki):
    """The HTTP port takes the gRPC port's TLS files: HTTPS only, client certificates from the CA
    required under mutual TLS, and the same API keys."""
    import ssl

    import httpx
    url = f"https://localhost:{mtls_server.app.http_port}/v1/translate"
    context = ssl.create_default_context(cafile=pki.ca)
    context.load_cert_chain(pki.client_cert, pki.client_key)
    with httpx.Client(verify=context, timeout=30) as http:
        ok = http.post(url, json={"texts": [TEXT]}, headers={"Authorization": f"Bearer {KEYS['alice']}"})
        assert ok.status_code == 200 and ok.json()["translations"][0]["hypotheses"][0]["text"]
        assert http.post(url, json={"texts": [TEXT]}).status_code == 401  # a certificate is not an API key
    with pytest.raises(httpx.HTTPError):  # no client certificate
        httpx.post(url, json={"texts": [TEXT]}, verify=ssl.create_default_context(cafile=pki.ca), timeout=30)
    with pytest.raises(httpx.HTTPError):  # plaintext on the TLS port
        httpx.post(url.replace("https://", "http://"), json={"texts": [TEXT]}, timeout=30)

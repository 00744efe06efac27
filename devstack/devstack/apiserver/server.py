"""The HTTP layer: Kubernetes REST paths, content negotiation, watch streams."""

from __future__ import annotations

import asyncio
import copy
import json
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from devstack.apiserver import (
    discovery,
    eviction,
    faults,
    logs,
    patching,
    protobuf,
    query,
    tables,
)
from devstack.apiserver.admission import (
    STRICT,
    WARN,
    admit_builtin,
    admit_custom,
    admit_update,
)
from devstack.apiserver.auth import (
    DEFAULT_TOKEN_SECONDS,
    Attributes,
    AuditLog,
    Authorizer,
    Tokens,
    User,
    token_request_response,
    unauthorized,
)
from devstack.apiserver.errors import (
    ApiError,
    JsonObject,
    bad_request,
    conflict,
    method_not_allowed,
    no_such_path,
    not_found,
    unsupported_media_type,
)
from devstack.apiserver.faults import Faults
from devstack.apiserver.peering import KOPF_PEERING_CRDS
from devstack.apiserver.registry import (
    CRD_GROUP,
    POLICY_GROUP,
    RBAC_GROUP,
    Registry,
    ResourceType,
    types_from_crd,
)
from devstack.apiserver.selectors import Predicate, field_selector, label_selector
from devstack.apiserver.store import Change, StorageKey, Store, now
from devstack.apiserver.watch import serve_watch, serve_watch_error, watch_request

CRD_KEY: StorageKey = (CRD_GROUP, "customresourcedefinitions")
USER = web.RequestKey("smoothscale.user", User)
"""Where a request keeps its authenticated User (absent: the admin, who sent no token)."""
_GENERATED_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


@dataclass(frozen=True)
class Target:
    """What a resource path addresses: /apis/G/V/namespaces/NS/PLURAL/NAME/SUBRESOURCE."""

    rt: ResourceType
    namespace: str
    name: str | None
    subresource: str | None


def _json(
    body: Any,
    status: int = 200,
    warnings: Sequence[str] = (),
    headers: dict[str, str] | None = None,
) -> web.Response:
    quoted = (
        '299 - "{}"'.format(warning.replace("\\", "\\\\").replace('"', '\\"'))
        for warning in warnings
    )
    headers = dict(headers or {})
    if warnings:
        headers["Warning"] = ", ".join(quoted)
    return web.Response(
        body=json.dumps(body).encode(),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def _get_path(obj: JsonObject, path: str) -> Any:
    value: Any = obj
    for part in path.strip(".").split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _set_path(obj: JsonObject, path: str, value: Any) -> None:
    *parents, last = path.strip(".").split(".")
    for part in parents:
        obj = obj.setdefault(part, {})
    obj[last] = value


class ApiServer:
    """Registry + store + the aiohttp application that serves them."""

    def __init__(
        self,
        history_size: int = 1000,
        audit_log: Path | None = None,
        kubelet_root: Path | None = None,
    ) -> None:
        """`audit_log`: where to append the audit Events of ServiceAccounts' requests.
        `kubelet_root`: the kubelets' pod directories, whose logs pods/log serves."""
        self.kubelet_root = kubelet_root
        self.registry = Registry()
        self.store = Store(history_size=history_size)
        self.store.listeners.append(self._on_change)
        self.stopping = asyncio.Event()
        self.faults = Faults()
        """Errors to answer the next matching requests with (tests ask at faults.PATH)."""
        self._open_watches: set[tuple[str, str, asyncio.Event]] = set()
        """(user, path, the event that ends it) of every watch being served."""
        self.tokens = Tokens()
        self.authorizer = Authorizer(self._rbac_objects)
        self.audit = AuditLog(audit_log) if audit_log is not None else None
        self.evictions = eviction.Evictions(
            self.store,
            self._type("", "v1", "pods"),
            self._type(POLICY_GROUP, "v1", "poddisruptionbudgets"),
        )
        for name in ("default", "kube-system", "kube-public"):
            self.create(self._type("", "v1", "namespaces"), {"metadata": {"name": name}})
        for crd in KOPF_PEERING_CRDS:
            self.create(
                self._type(CRD_GROUP, "v1", "customresourcedefinitions"), copy.deepcopy(crd)
            )

    def _type(self, group: str, version: str, plural: str) -> ResourceType:
        return self.registry.get(group, version, plural)

    def _rbac_objects(self, plural: str, namespace: str | None) -> list[JsonObject]:
        return self.store.list(self._type(RBAC_GROUP, "v1", plural), namespace)

    def load_crds(self, paths: Sequence[Path]) -> None:
        """Create (or replace) the CRDs in these YAML files or directories of YAML files."""
        files: list[Path] = []
        for path in paths:
            files.extend(sorted(path.glob("*.y*ml")) if path.is_dir() else [path])
        crd_type = self._type(CRD_GROUP, "v1", "customresourcedefinitions")
        for file in files:
            for document in yaml.safe_load_all(file.read_text()):
                if not document or document.get("kind") != "CustomResourceDefinition":
                    continue
                if self.store.exists(crd_type, "", document["metadata"]["name"]):
                    self.update(crd_type, document)
                else:
                    self.create(crd_type, document)

    def _on_change(self, key: StorageKey, change: Change) -> None:
        if key == ("", "namespaces") and change.type == "ADDED":
            # What Kubernetes' serviceaccounts controller does: each namespace has a "default".
            namespace = change.object["metadata"]["name"]
            self.create(
                self._type("", "v1", "serviceaccounts"),
                {"metadata": {"name": "default"}},
                namespace=namespace,
            )
        if key != CRD_KEY:
            return
        crd = change.old if change.type == "DELETED" and change.old is not None else change.object
        spec = crd["spec"]
        group, plural = spec["group"], spec["names"]["plural"]
        if change.type == "DELETED":
            for rt in [rt for rt in self.registry if rt.key == (group, plural)][:1]:
                self.store.drop_resource(rt)
            self.registry.replace_crd_types(group, plural, [])
        else:
            self.registry.replace_crd_types(group, plural, types_from_crd(change.object))

    # -- the write paths, shared by HTTP and start-up -----------------------------------------

    def _admit(
        self, rt: ResourceType, obj: JsonObject, field_validation: str
    ) -> tuple[JsonObject, list[str]]:
        rt.stamp(obj)
        if rt.custom:
            return admit_custom(rt, obj, field_validation)
        return admit_builtin(rt, obj), []

    def create(
        self,
        rt: ResourceType,
        obj: JsonObject,
        *,
        namespace: str = "",
        field_validation: str = STRICT,
        dry_run: bool = False,
    ) -> tuple[JsonObject, list[str]]:
        meta = obj.setdefault("metadata", {})
        if rt.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request"
                )
            meta["namespace"] = namespace
            namespaces = self._type("", "v1", "namespaces")
            if not self.store.exists(namespaces, "", namespace):
                raise not_found("namespaces", namespace)
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            suffix = "".join(secrets.choice(_GENERATED_NAME_ALPHABET) for _ in range(5))
            meta["name"] = meta["generateName"] + suffix
        if rt.status_subresource:
            obj.pop("status", None)
        obj, warnings = self._admit(rt, obj, field_validation)
        return self.store.create(rt, obj, dry_run=dry_run), warnings

    def update(
        self,
        rt: ResourceType,
        obj: JsonObject,
        *,
        subresource: str | None = None,
        field_validation: str = STRICT,
        dry_run: bool = False,
    ) -> tuple[JsonObject, list[str]]:
        meta = obj.setdefault("metadata", {})
        current = self.store.get(rt, meta.get("namespace", ""), meta.get("name", ""))
        if subresource == "status":
            status = obj.get("status")
            obj = copy.deepcopy(current)
            obj["metadata"]["resourceVersion"] = meta.get("resourceVersion")
            obj.pop("status", None)
            if status is not None:
                obj["status"] = status
        elif rt.status_subresource:
            obj.pop("status", None)
            if "status" in current:
                obj["status"] = current["status"]
        if not rt.custom:
            admit_update(rt, current, obj)
        obj, warnings = self._admit(rt, obj, field_validation)
        return self.store.update(rt, obj, dry_run=dry_run), warnings

    # -- HTTP ---------------------------------------------------------------------------------

    def application(self) -> web.Application:
        app = web.Application(
            middlewares=[self._errors, self._authenticate, self._inject_faults],
            client_max_size=16 * 1024 * 1024,
        )
        app.router.add_route("*", faults.PATH, self._faults)
        fixed = {
            "/version": lambda: discovery.KUBERNETES_VERSION,
            "/api": discovery.api_versions,
            "/apis": lambda: discovery.api_group_list(self.registry),
            "/openapi/v3": lambda: discovery.openapi_v3_index(self.registry),
        }
        for path, document in fixed.items():
            app.router.add_get(path, self._document_handler(document))
        for probe in ("/healthz", "/readyz", "/livez"):
            app.router.add_get(probe, self._healthy)
        app.router.add_get("/openapi/v3/{path:.+}", self._openapi_document)
        app.router.add_route("*", "/api/{version}", self._core_root)
        app.router.add_route("*", "/api/{version}/{rest:.+}", self._core)
        app.router.add_route("*", "/apis/{group}", self._group_root)
        app.router.add_route("*", "/apis/{group}/{version}", self._group_version_root)
        app.router.add_route("*", "/apis/{group}/{version}/{rest:.+}", self._grouped)
        return app

    @web.middleware
    async def _inject_faults(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        watch = request.query.get("watch") in ("true", "1")
        user: User | None = request.get(USER)
        name = faults.ADMIN if user is None else user.name
        error = self.faults.take(request.method, request.path, watch, name)
        if error is not None and watch and error.code == 410:
            # A real server answers an expired watch inside the stream, never with a 410 status
            # (its watch cache's error watcher); clients such as kopf rely on it.
            return await serve_watch_error(request, error.status())
        if error is not None:
            return _json(error.status(), status=error.code)
        response: web.StreamResponse = await handler(request)
        return response

    async def _faults(self, request: web.Request) -> web.Response:
        """POST a JSON list of faults to inject; GET how many were injected."""
        if request.method == "POST":
            try:
                added = [faults.Fault.parse(item) for item in await request.json()]
            except (ValueError, KeyError, TypeError) as error:
                raise bad_request(f"faults: {error}") from error
            self.faults.add(added)
            # A fault for watches ends the open ones it matches, as a real server ends a watch
            # at its timeout: their clients watch again, from where they were, and meet it.
            for user, path, ended in self._open_watches:
                if any(f.watch and f.matches("GET", path, True, user) for f in added):
                    ended.set()
        return _json(self.faults.report())

    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
        except ApiError as error:
            return _json(error.status(), status=error.code, headers=error.headers())
        except web.HTTPNotFound:
            return _json(no_such_path().status(), status=404)
        return response

    @web.middleware
    async def _authenticate(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        """A bearer token must be a live ServiceAccount token (401 otherwise); without one the
        request is the admin's."""
        header = request.headers.get("Authorization", "")
        if header:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise unauthorized()
            request[USER] = self.tokens.user_of(token.strip(), self._service_account_uid)
        response: web.StreamResponse = await handler(request)
        return response

    def _service_account_uid(self, namespace: str, name: str) -> str | None:
        accounts = self._type("", "v1", "serviceaccounts")
        if not self.store.exists(accounts, namespace, name):
            return None
        uid: str = self.store.get(accounts, namespace, name)["metadata"]["uid"]
        return uid

    def _authorize(self, request: web.Request, target: Target, verb: str) -> None:
        """RBAC for a ServiceAccount's request (the admin may do anything); audited."""
        user: User | None = request.get(USER)
        if user is None:
            return
        name = target.name or ""
        selector = request.query.get("fieldSelector", "")
        if verb in ("list", "watch") and selector.startswith("metadata.name="):
            name = selector.removeprefix("metadata.name=")  # as RBAC's resourceNames see it
        attributes = Attributes(
            verb=verb,
            group=target.rt.group,
            version=target.rt.version,
            resource=target.rt.plural,
            subresource=target.subresource or "",
            namespace=target.namespace,
            name="" if "," in name else name,
            path=request.path_qs,
        )
        try:
            self.authorizer.authorize(user, attributes)
        except ApiError as error:
            if self.audit is not None:
                self.audit.record(user, attributes, allowed=False, reason=error.message)
            raise
        if self.audit is not None:
            self.audit.record(user, attributes, allowed=True)

    def _document_handler(
        self, document: Callable[[], JsonObject]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(_: web.Request) -> web.Response:
            return _json(document())

        return handler

    @staticmethod
    async def _healthy(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    @staticmethod
    async def _respond(body: JsonObject | None) -> web.Response:
        if body is None:
            raise no_such_path()
        return _json(body)

    async def _openapi_document(self, request: web.Request) -> web.Response:
        parts = request.match_info["path"].split("/")
        if parts[0] == "api" and len(parts) == 2:
            return await self._respond(discovery.openapi_v3_document(self.registry, "", parts[1]))
        if parts[0] == "apis" and len(parts) == 3:
            return await self._respond(
                discovery.openapi_v3_document(self.registry, parts[1], parts[2])
            )
        raise no_such_path()

    async def _core_root(self, request: web.Request) -> web.Response:
        return await self._respond(
            discovery.api_resource_list(self.registry, "", request.match_info["version"])
        )

    async def _group_root(self, request: web.Request) -> web.Response:
        return await self._respond(discovery.api_group(self.registry, request.match_info["group"]))

    async def _group_version_root(self, request: web.Request) -> web.Response:
        info = request.match_info
        return await self._respond(
            discovery.api_resource_list(self.registry, info["group"], info["version"])
        )

    async def _core(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(
            request, "", request.match_info["version"], request.match_info["rest"]
        )

    async def _grouped(self, request: web.Request) -> web.StreamResponse:
        info = request.match_info
        return await self._serve(request, info["group"], info["version"], info["rest"])

    def _target(self, group: str, version: str, rest: str) -> Target:
        parts = rest.strip("/").split("/")
        namespace = ""
        if parts[0] == "namespaces" and len(parts) >= 3:
            namespace, parts = parts[1], parts[2:]
        if len(parts) > 3:
            raise no_such_path()
        rt = self.registry.get(group, version, parts[0])
        if namespace and not rt.namespaced:
            raise no_such_path()
        subresource = parts[2] if len(parts) == 3 else None
        pod_only = subresource in ("binding", "eviction", "log") and rt.key == ("", "pods")
        token = subresource == "token" and rt.key == ("", "serviceaccounts")
        if (
            (subresource not in (None, "status", "scale") and not pod_only and not token)
            or (subresource == "scale" and rt.scale is None)
            or (subresource == "status" and not rt.status_subresource)
        ):
            raise no_such_path()
        return Target(rt, namespace, parts[1] if len(parts) >= 2 else None, subresource)

    async def _serve(
        self, request: web.Request, group: str, version: str, rest: str
    ) -> web.StreamResponse:
        target = self._target(group, version, rest)
        method = request.method
        if target.name is None:
            if method == "GET" and query.flag(request.query, "watch"):
                self._authorize(request, target, "watch")
                return await self._watch(request, target)
            if method == "GET":
                self._authorize(request, target, "list")
                return self._list(request, target)
            if method == "POST" and (target.namespace or not target.rt.namespaced):
                self._authorize(request, target, "create")
                return await self._create(request, target)
            raise method_not_allowed(f"{method} is not supported on a collection here")
        verbs = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
        self._authorize(request, target, "create" if method == "POST" else verbs.get(method, ""))
        if target.subresource == "token":
            if method != "POST":
                raise method_not_allowed("a token can only be requested (POST)")
            return await self._token(request, target)
        if target.subresource == "scale":
            return await self._scale(request, target)
        if target.subresource == "binding":
            if method != "POST":
                raise method_not_allowed("a binding can only be created (POST)")
            return await self._bind(request, target)
        if target.subresource == "eviction":
            if method != "POST":
                raise method_not_allowed("an eviction can only be created (POST)")
            return await self._evict(request, target)
        if target.subresource == "log":
            if method != "GET":
                raise method_not_allowed("a pod's log can only be read (GET)")
            rt, namespace, name = target.rt, target.namespace, target.name
            pod = self.store.get(rt, namespace, name)

            def pod_now() -> JsonObject | None:
                exists = self.store.exists(rt, namespace, name)
                return self.store.get(rt, namespace, name) if exists else None

            return await logs.serve(request, pod, pod_now, self.kubelet_root, self.stopping)
        if method == "GET":
            obj = self.store.get(target.rt, target.namespace, target.name)
            return self._render(request, target.rt, [obj], single=True)
        if method == "PUT":
            return await self._replace(request, target)
        if method == "PATCH":
            return await self._patch(request, target)
        if method == "DELETE":
            return await self._delete(request, target)
        raise method_not_allowed(f"{method} is not supported on {target.rt.resource}")

    # -- reads ----------------------------------------------------------------------------

    def _filters(self, request: web.Request) -> Predicate:
        labels = label_selector(request.query.get("labelSelector"))
        fields = field_selector(request.query.get("fieldSelector"))
        return lambda obj: labels(obj) and fields(obj)

    def _list(self, request: web.Request, target: Target) -> web.Response:
        matches = self._filters(request)
        namespace = target.namespace if target.rt.namespaced and target.namespace else None
        items = [
            target.rt.stamp(obj) for obj in self.store.list(target.rt, namespace) if matches(obj)
        ]
        return self._render(request, target.rt, items, single=False)

    def _render(
        self, request: web.Request, rt: ResourceType, objects: list[JsonObject], *, single: bool
    ) -> web.Response:
        version = str(self.store.resource_version)
        if "as=Table" in request.headers.get("Accept", ""):
            include = request.query.get("includeObject", "Metadata")
            return _json(tables.table(rt, objects, version, include))
        if single:
            return _json(rt.stamp(objects[0]))
        return _json(
            {
                "kind": f"{rt.kind}List",
                "apiVersion": rt.api_version,
                "metadata": {"resourceVersion": version},
                "items": objects,
            }
        )

    async def _watch(self, request: web.Request, target: Target) -> web.StreamResponse:
        namespace = target.namespace if target.rt.namespaced else ""
        watch = watch_request(request, target.rt, namespace, self._filters(request))
        user: User | None = request.get(USER)
        ended = asyncio.Event()
        opened = (faults.ADMIN if user is None else user.name, request.path, ended)
        self._open_watches.add(opened)
        try:
            return await serve_watch(request, watch, self.store, self.stopping, ended)
        finally:
            self._open_watches.discard(opened)

    # -- writes ---------------------------------------------------------------------------

    @staticmethod
    async def _body(request: web.Request) -> Any:
        if request.content_type == protobuf.MEDIA_TYPE:
            return protobuf.decode(await request.read())
        text = await request.text()
        if not text.strip():
            return None
        try:
            if request.content_type == patching.APPLY_PATCH or request.content_type.endswith(
                "yaml"
            ):
                return yaml.safe_load(text)
            return json.loads(text)
        except (ValueError, yaml.YAMLError) as error:
            raise bad_request(
                f"the request body is not valid {request.content_type}: {error}"
            ) from None

    async def _object_body(self, request: web.Request) -> JsonObject:
        body = await self._body(request)
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        return body

    @staticmethod
    def _options(request: web.Request) -> tuple[str, bool]:
        # Without the parameter a real API server warns about unknown fields and drops them.
        validation = request.query.get("fieldValidation", WARN)
        return validation, request.query.get("dryRun") == "All"

    def _check_kind(self, rt: ResourceType, obj: JsonObject) -> None:
        kind, api_version = obj.get("kind"), obj.get("apiVersion")
        if kind not in (None, rt.kind) or api_version not in (None, rt.api_version):
            raise bad_request(
                f"the object is a {api_version}, Kind={kind}, but this path serves "
                f"{rt.api_version}, Kind={rt.kind}"
            )

    async def _create(self, request: web.Request, target: Target) -> web.Response:
        obj = await self._object_body(request)
        self._check_kind(target.rt, obj)
        validation, dry_run = self._options(request)
        created, warnings = self.create(
            target.rt, obj, namespace=target.namespace, field_validation=validation, dry_run=dry_run
        )
        return _json(target.rt.stamp(created), status=201, warnings=warnings)

    def _addressed(self, target: Target, obj: JsonObject) -> JsonObject:
        meta = obj.setdefault("metadata", {})
        if meta.get("name", target.name) != target.name:
            raise bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                f"({target.name})"
            )
        meta["name"] = target.name
        if target.rt.namespaced:
            meta["namespace"] = target.namespace
        return obj

    async def _replace(self, request: web.Request, target: Target) -> web.Response:
        obj = self._addressed(target, await self._object_body(request))
        self._check_kind(target.rt, obj)
        validation, dry_run = self._options(request)
        updated, warnings = self.update(
            target.rt,
            obj,
            subresource=target.subresource,
            field_validation=validation,
            dry_run=dry_run,
        )
        return _json(target.rt.stamp(updated), warnings=warnings)

    def _patched(
        self, rt: ResourceType, current: JsonObject | None, content_type: str, patch: Any
    ) -> JsonObject:
        if content_type == patching.JSON_PATCH:
            return patching.json_patch(current or {}, patch)
        if not isinstance(patch, dict):
            raise bad_request("the patch must be a JSON object")
        if content_type == patching.MERGE_PATCH:
            merged: JsonObject = patching.merge_patch(current, patch)
            return merged
        if content_type == patching.STRATEGIC_MERGE_PATCH:
            if rt.custom:
                raise unsupported_media_type(
                    f"{content_type} is not supported by custom resources: "
                    "use a merge or JSON patch"
                )
            strategic: JsonObject = patching.strategic_merge_patch(current, patch)
            return strategic
        if content_type == patching.APPLY_PATCH:
            return patching.apply_patch(current, patch)
        raise unsupported_media_type(content_type)

    async def _patch(self, request: web.Request, target: Target) -> web.Response:
        assert target.name is not None
        rt = target.rt
        patch = await self._body(request)
        validation, dry_run = self._options(request)
        content_type = request.content_type
        if not self.store.exists(rt, target.namespace, target.name):
            if content_type != patching.APPLY_PATCH or target.subresource:
                raise not_found(rt.resource, target.name)
            self._authorize(request, target, "create")  # an apply that creates needs both
            obj = self._addressed(target, self._patched(rt, None, content_type, patch))
            created, warnings = self.create(
                rt, obj, namespace=target.namespace, field_validation=validation, dry_run=dry_run
            )
            return _json(rt.stamp(created), status=201, warnings=warnings)
        current = rt.stamp(self.store.get(rt, target.namespace, target.name))
        obj = self._addressed(target, self._patched(rt, current, content_type, patch))
        updated, warnings = self.update(
            rt, obj, subresource=target.subresource, field_validation=validation, dry_run=dry_run
        )
        return _json(rt.stamp(updated), warnings=warnings)

    async def _delete(self, request: web.Request, target: Target) -> web.Response:
        assert target.name is not None
        options = await self._body(request) or {}
        if "gracePeriodSeconds" in request.query:  # DeleteOptions may come as query parameters
            grace = query.number(request.query, "gracePeriodSeconds", 0)
            options["gracePeriodSeconds"] = int(grace)
        dry_run = request.query.get("dryRun") == "All" or "All" in (options.get("dryRun") or [])
        current = self.store.get(target.rt, target.namespace, target.name)
        self._check_preconditions(target, current, options)
        obj, removed = self.store.delete(
            target.rt,
            target.namespace,
            target.name,
            grace_seconds=self._grace_seconds(target.rt, current, options),
            dry_run=dry_run,
        )
        return _json(target.rt.stamp(obj), status=200 if removed else 202)

    @staticmethod
    def _check_preconditions(target: Target, current: JsonObject, options: JsonObject) -> None:
        """DeleteOptions.preconditions: the uid and resourceVersion the object must have."""
        preconditions = options.get("preconditions") or {}
        for field in ("uid", "resourceVersion"):
            if preconditions.get(field) not in (None, current["metadata"][field]):
                raise conflict(target.rt.resource, str(target.name))

    async def _evict(self, request: web.Request, target: Target) -> web.Response:
        """POST pods/NAME/eviction: delete the pod unless its PodDisruptionBudget forbids it
        (eviction.py)."""
        assert target.name is not None
        namespace, name = target.namespace, target.name
        options, dry_run = eviction.delete_options(
            await self._object_body(request), name, request.query.get("dryRun") == "All"
        )
        self._check_preconditions(target, self.store.get(target.rt, namespace, name), options)

        def delete(options: JsonObject, dry_run: bool) -> None:
            current = self.store.get(target.rt, namespace, name)
            grace = self._grace_seconds(target.rt, current, options)
            self.store.delete(target.rt, namespace, name, grace_seconds=grace, dry_run=dry_run)

        return _json(self.evictions.evict(namespace, name, options, dry_run, delete), status=201)

    @staticmethod
    def _grace_seconds(rt: ResourceType, current: JsonObject, options: JsonObject) -> int:
        """A pod bound to a node is deleted gracefully, as a real API server does: the given
        gracePeriodSeconds, else spec.terminationGracePeriodSeconds, else 30."""
        if rt.key != ("", "pods") or not current.get("spec", {}).get("nodeName"):
            return 0
        grace = options.get("gracePeriodSeconds")
        if grace is None:
            grace = current["spec"].get("terminationGracePeriodSeconds", 30)
        return max(int(grace), 0)

    async def _bind(self, request: web.Request, target: Target) -> web.Response:
        """POST pods/NAME/binding: what a scheduler does, sets spec.nodeName once (and the
        PodScheduled condition True)."""
        assert target.name is not None
        binding = await self._object_body(request)
        node = (binding.get("target") or {}).get("name")
        if not node:
            raise bad_request("a Binding needs target.name: the node to bind the pod to")
        pod = self.store.get(target.rt, target.namespace, target.name)
        if pod.get("spec", {}).get("nodeName"):
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{target.name}": pod '
                f'{target.name} is already assigned to node "{pod["spec"]["nodeName"]}"',
            )
        pod.setdefault("spec", {})["nodeName"] = node
        status = pod.setdefault("status", {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": now(),
            },
            *conditions,
        ]
        self.store.update(target.rt, pod)
        return _json({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}, 201)

    async def _token(self, request: web.Request, target: Target) -> web.Response:
        """POST serviceaccounts/NAME/token: a TokenRequest answered with a new token."""
        assert target.name is not None
        account = self.store.get(target.rt, target.namespace, target.name)
        token_request = await self._body(request) or {}
        if not isinstance(token_request, dict):
            raise bad_request("the request body must be a TokenRequest")
        seconds = (token_request.get("spec") or {}).get("expirationSeconds")
        seconds = DEFAULT_TOKEN_SECONDS if seconds is None else int(seconds)
        if seconds < 600:
            raise ApiError(
                422,
                "Invalid",
                f'TokenRequest.authentication.k8s.io "{target.name}" is invalid: '
                f"spec.expirationSeconds: Invalid value: {seconds}: may not specify a duration "
                "less than 10 minutes",
            )
        token, expires = self.tokens.issue(account, seconds)
        return _json(token_request_response(account, token_request, token, expires), status=201)

    # -- the scale subresource --------------------------------------------------------------

    def _scale_of(self, rt: ResourceType, obj: JsonObject) -> JsonObject:
        assert rt.scale is not None
        meta = obj["metadata"]
        status: JsonObject = {"replicas": _get_path(obj, rt.scale.status_replicas) or 0}
        if rt.scale.label_selector and _get_path(obj, rt.scale.label_selector):
            status["selector"] = _get_path(obj, rt.scale.label_selector)
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                key: meta[key]
                for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if key in meta
            },
            "spec": {"replicas": _get_path(obj, rt.scale.spec_replicas) or 0},
            "status": status,
        }

    async def _scale(self, request: web.Request, target: Target) -> web.Response:
        rt, scale_paths = target.rt, target.rt.scale
        assert target.name is not None
        assert scale_paths is not None
        current = self.store.get(rt, target.namespace, target.name)
        scale = self._scale_of(rt, current)
        if request.method == "GET":
            return _json(scale)
        if request.method == "PUT":
            wanted = await self._object_body(request)
        elif request.method == "PATCH":
            content_type = request.content_type
            if content_type == patching.STRATEGIC_MERGE_PATCH:
                content_type = patching.MERGE_PATCH  # a Scale has no lists: the same result
            wanted = self._patched(rt, scale, content_type, await self._body(request))
        else:
            raise method_not_allowed(f"{request.method} is not supported on {rt.resource}/scale")
        replicas = wanted.get("spec", {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise ApiError(
                422,
                "Invalid",
                f'Scale.autoscaling "{target.name}" is invalid: spec.replicas: Invalid value: '
                f"{json.dumps(replicas)}: must be a non-negative integer",
            )
        _set_path(current, scale_paths.spec_replicas, replicas)
        current["metadata"]["resourceVersion"] = wanted.get("metadata", {}).get(
            "resourceVersion", current["metadata"]["resourceVersion"]
        )
        validation, dry_run = self._options(request)
        updated, _ = self.update(rt, current, field_validation=validation, dry_run=dry_run)
        return _json(self._scale_of(rt, updated))

"""The web calculator's FastAPI app: the JSON API over `estimate()` and the one static page.

Endpoints (OpenAPI docs at ``/docs``):

- ``POST /api/estimate``: body with the CLI's names -> exactly ``estimate(...).to_dict()`` (what
  ``speedlimit estimate --json`` prints).
- ``POST /api/curve``: same body (plus optional ``batches``) -> the estimate, the batch curve with
  its knee and the roofline (`speedlimit.estimator.curves`); the page makes one such call per change.
- ``POST /api/simulate``: same body plus the load (``load``, ``values``, ``requests``, ``seed``, a shared
  ``prefix_tokens``), the engine (``engine``, ``max_seqs``, ``max_batched_tokens``, ``chunked_prefill``,
  ``prefix_caching``, ``slot_streams``) and ``slo`` -> the serving view: a
  simulated load sweep, bounded to about a second of work (`speedlimit.web.serving`).
- ``GET /api/models``, ``GET /api/hardware``, ``GET /api/engines``: the catalogs.
- ``GET /`` the page, ``/static/*`` its assets, ``/vendor/plotly.min.js`` the chart library served
  from the installed ``plotly`` wheel, ``/docs`` Swagger UI from the files inside the installed ``fastapi-offline`` wheel
  (nothing comes from a CDN; the docs work offline).

Bad input (unknown names, out-of-range numbers, a broken pasted config, malformed JSON) -> 422 with
``{"detail": "one readable line"}`` in the API's field names; a body over 1 MB -> 413 (`speedlimit.web.limits`).
The API takes catalog names, sizes and pasted configs only: it never touches the server's file system, so a
name that happens to be a file there gets the same answer as any unknown name.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import Field, ValidationError

from speedlimit.architecture import Architecture, architecture_from_hf_config
from speedlimit.catalog import catalog_engine, engine_names, engine_record, hardware_entries, model_entries, resolve_model
from speedlimit.artifacts import finite_json
from speedlimit.errors import SpeedlimitError
from speedlimit.estimator.api import estimate_scenario
from speedlimit.estimator.curves import batch_curve, roofline
from speedlimit.web.limits import MAX_BODY_BYTES, BodySizeLimit, web_wording
from speedlimit.scenario import SCENARIO_FIELDS, Scenario, scenario_from

STATIC_DIR = Path(str(resources.files("speedlimit.web").joinpath("static")))
SWAGGER_UI_DIR = Path(str(resources.files("fastapi_offline").joinpath("static")))  # Swagger UI 5 from the wheel
MAX_CURVE_POINTS = 200
MAX_MODEL_NAME_CHARS = 300


class EstimateRequest(Scenario):
    """One configuration: the `Scenario` fields, named as on the `speedlimit estimate` command line, plus a pasted config."""

    model: str | None = Field(None, description="Catalog name or alias, or a size like 7B. Optional when `config` is given (then it names it).")
    hardware: str | None = Field(None, description="Catalog hardware name or calibrated profile name (or give `bandwidth`).")
    config: dict[str, Any] | None = Field(None, description="A pasted Hugging Face config.json (object) instead of a catalog model.")
    engine: str | None = Field(None, description=Scenario.model_fields["engine"].description)

    def scenario(self, model: Architecture | str) -> Scenario:
        """The request as a `Scenario` of ``model`` (the pasted config or the catalog name)."""
        return scenario_from(**{**self.model_dump(include=set(SCENARIO_FIELDS)), "model": model})


class CurveRequest(EstimateRequest):
    batches: list[int] | None = Field(None, description=f"Batch sizes for the curve (at most {MAX_CURVE_POINTS}); default ~√2 steps past the memory limit.")


def web_model(request: EstimateRequest) -> Architecture:
    """The model to estimate: a pasted config, else a catalog name or a size (never a server-side file)."""
    if request.config is not None:
        name = (request.model or "").strip() or "pasted config.json"
        try:
            return architecture_from_hf_config(request.config, name=name, source="pasted config.json")
        except SpeedlimitError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError) as error:
            raise SpeedlimitError(f"the pasted config.json could not be read ({type(error).__name__}: {error}); paste a Hugging Face decoder-only config.json") from None
    text = (request.model or "").strip()
    if not text:
        raise SpeedlimitError("pick a catalog model, give a size like 7B, or paste a config.json")
    if len(text) > MAX_MODEL_NAME_CHARS:
        raise SpeedlimitError(f"model name is {len(text):,} characters long; pick a catalog model or paste the config.json")
    if Path(text).suffix.lower() in (".json", ".gguf") or text.startswith(("/", "~", ".", "\\")):  # by its text alone
        raise SpeedlimitError("the web calculator does not read files: pick a catalog model, give a size like 7B, or paste the config.json")
    return resolve_model(text, files=False)


def _readable_validation_error(error: RequestValidationError) -> str:
    parts = []
    for item in error.errors():
        location = ".".join(str(p) for p in item.get("loc", ()) if p != "body") or "body"
        message = web_wording(str(item.get("msg", "invalid")).removeprefix("Value error, "))  # Scenario says --flags
        if item.get("type") == "json_invalid":
            location, message = "body", f"not valid JSON ({item.get('ctx', {}).get('error', 'parse error')})"
        elif item.get("type") == "extra_forbidden":
            message = "unknown field (use the CLI names: model, hardware, engine, weights, kv, batch, prompt, output, tp, pp, dp, ep, ideal, config)"
        parts.append(f"{location}: {message}")
    return "; ".join(parts) or "invalid request"


def plotly_js_path() -> Path | None:
    """plotly.min.js inside the installed `plotly` wheel, or None when plotly is not installed."""
    try:
        import plotly
    except ImportError:
        return None
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    return path if path.is_file() else None


def create_app() -> FastAPI:
    """The calculator app (used by `speedlimit serve` and by the tests)."""
    app = FastAPI(
        title="speedlimit",
        summary="How fast will this LLM run on this hardware? The estimator as a JSON API.",
        version="0.1.0",
        docs_url=None,  # served below from local files
        redoc_url=None,
    )
    app.add_middleware(BodySizeLimit, max_bytes=MAX_BODY_BYTES)

    @app.exception_handler(SpeedlimitError)
    async def _speedlimit_error(_: Request, error: SpeedlimitError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": web_wording(str(error))})

    @app.exception_handler(ValidationError)
    async def _inner_validation_error(_: Request, error: ValidationError) -> JSONResponse:
        # a value derived from the request failed a model's bounds deep inside the estimator
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return JSONResponse(status_code=422, content={"detail": f"input leads to an invalid {error.title} ({where}: {first.get('msg', 'invalid')}); check the sizes you gave"})

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": _readable_validation_error(error)})

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index() -> HTMLResponse:
        return HTMLResponse((STATIC_DIR / "index.html").read_text(encoding="utf-8"))

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title="speedlimit API",
            swagger_js_url="/vendor/swagger-ui/swagger-ui-bundle.js", swagger_css_url="/vendor/swagger-ui/swagger-ui.css",
            swagger_favicon_url="/vendor/swagger-ui/favicon.png",
            swagger_ui_parameters={"validatorUrl": None},  # its default posts the schema to an online validator
        )

    @app.get("/vendor/plotly.min.js", include_in_schema=False)
    def plotly_js() -> Response:
        path = plotly_js_path()
        if path is None:
            return Response("/* plotly is not installed: pip install plotly */", status_code=404, media_type="text/javascript")
        return FileResponse(path, media_type="text/javascript", headers={"Cache-Control": "public, max-age=86400"})

    @app.get("/api/models", summary="Catalog models")
    def models() -> list[dict[str, Any]]:
        return [
            {"name": key, "label": entry.get("name", key), "published_params": entry.get("published_params"), "aliases": entry.get("aliases", []), "source": entry.get("source", "")}
            for key, entry in model_entries().items()
        ]

    @app.get("/api/hardware", summary="Catalog hardware")
    def hardware() -> list[dict[str, Any]]:
        return [
            {
                "name": key,
                "label": entry.get("name", key),
                "kind": entry.get("kind", ""),
                "memory_bytes": entry.get("memory_bytes"),
                "memory_bandwidth_Bps": entry.get("memory_bandwidth_Bps"),
                "sockets": entry.get("sockets"),  # CPUs: the bandwidth is summed over them
                "source": entry.get("source", ""),
            }
            for key, entry in hardware_entries().items()
        ]

    @app.get("/api/engines", summary="Serving-engine profiles (catalog/engines.toml)")
    def engines() -> list[dict[str, Any]]:
        return [engine_record(catalog_engine(key)) for key in engine_names()]

    @app.post("/api/estimate", summary="Estimate one configuration (what `speedlimit estimate --json` prints)")
    def estimate_endpoint(request: EstimateRequest) -> dict[str, Any]:
        return finite_json(estimate_scenario(request.scenario(web_model(request))).to_dict())

    @app.post("/api/curve", summary="The estimate, its batch curve with the knee, and its roofline")
    def curve_endpoint(request: CurveRequest) -> dict[str, Any]:
        if request.batches is not None and not 1 <= len(request.batches) <= MAX_CURVE_POINTS:
            raise SpeedlimitError(f"batches must list 1 to {MAX_CURVE_POINTS} batch sizes")
        scenario = request.scenario(web_model(request))
        inputs = scenario.model_dump(exclude={"model", "hardware"})
        result = batch_curve(scenario.model, scenario.hardware, batches=request.batches, **inputs)
        result["roofline"] = roofline(result["estimate"])
        return finite_json(result)

    from speedlimit.web.serving import SimulateRequest, simulate_view  # it builds on EstimateRequest above

    def simulate_endpoint(request: SimulateRequest) -> dict[str, Any]:
        return finite_json(simulate_view(request, request.scenario(web_model(request))))

    simulate_endpoint.__annotations__["request"] = SimulateRequest  # a class from this scope, not a global name
    app.post("/api/simulate", summary="The serving view: a simulated load sweep (what `speedlimit simulate --sweep` "
                                      "reports), within about a second of work")(simulate_endpoint)

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.mount("/vendor/swagger-ui", StaticFiles(directory=SWAGGER_UI_DIR), name="swagger-ui")
    return app

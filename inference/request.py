"""The body of serve.py's POST /predict as a pydantic model, and the one-line error a bad body gets.

    PredictRequest(texts=["not bad"], attention=False, explain=False)

parse_request reads a body against the server's limits (inference/limits.py) before any worker sees it. The JSON is
read by Python's json module, which keeps a "\\ud800" escape as a lone surrogate: such a text is answered on its
own with a per-text error (inference/texts.py), so the other texts of the request, and of the requests batched
with it, are answered as usual.
"""

import json

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inference.limits import ServerLimits

SHOWN = 10  # positions named in one error


class PredictRequest(BaseModel):
    """POST /predict's body: strict types (true is not a list, 1 is not a boolean), no unknown field (so no request
    can name a file or a checkpoint)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    texts: list[str] = Field(min_length=1, description="the texts to classify")
    attention: bool = Field(False, description="add tokens and each layer's weights (predict.py --attention)")
    explain: bool = Field(False, description="the five explanation methods per token (predict.py --explain)")


class BadRequest(ValueError):
    """A request the server refuses: its HTTP status and one line saying what is wrong."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def parse_request(body: bytes, limits: ServerLimits, ensemble: bool) -> PredictRequest:
    """The request, or BadRequest: 400 for a body that is not JSON, 422 for one that breaks the model or a limit
    (413, a body over max_bytes, is the transport's: it is refused before the body is read whole)."""
    try:
        data = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(400, f"the body is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise BadRequest(422, f'the body must be a JSON object {{"texts": [...]}}, not a {type(data).__name__}')
    try:
        request = PredictRequest.model_validate(data)
    except ValidationError as e:
        raise BadRequest(422, describe(e)) from e
    if len(request.texts) > limits.max_texts:
        raise BadRequest(422, f'"texts" holds {len(request.texts)} texts; at most {limits.max_texts} per request '
                              "(the server's --max-texts)")
    if ensemble and (request.attention or request.explain):
        raise BadRequest(422, "attention belongs to one network: this server runs an ensemble (several --ckpt)")
    return request


def describe(error: ValidationError) -> str:
    """pydantic's errors in one line: the field, what is wrong, for each (positions of a list grouped)."""
    fields = ", ".join(f'"{name}"' for name in PredictRequest.model_fields)
    parts, positions = [], []
    for item in error.errors():
        where = item["loc"]
        if item["type"] == "missing":
            parts.append(f'missing field "{where[0]}"')
        elif item["type"] == "extra_forbidden":
            parts.append(f'unknown field "{where[0]}" (the fields are {fields})')
        elif where[0] == "texts" and len(where) == 2:
            positions.append(str(where[1]))
        elif item["type"] == "too_short":
            parts.append(f'"{where[0]}" is empty: give at least one text')
        else:
            kind = "a list of strings" if where[0] == "texts" else "a boolean"
            parts.append(f'"{where[0]}" must be {kind}, not {type(item["input"]).__name__}')
    if positions:
        parts.append(f'"texts" must hold strings; not a string at position(s) {", ".join(positions[:SHOWN])}')
    return "; ".join(parts)

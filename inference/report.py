"""One self-contained HTML page for explanations (predict.py --explain --html report.html).

Nothing is fetched: the CSS, the script and the data are inline, so the file opens offline and can be mailed. Per
text: label and probabilities; the tokens shaded by one method at a time (the switch at the top; by default the
method whose top tokens, replaced by [UNK], lower p(predicted class) most over the page's texts: the faithfulness
table's mean drop), signed methods on a diverging orange–purple scale, attention weights on a sequential one, each
scaled to its own largest |score|; that text's faithfulness table with a line per column; the attention map of every
layer and head, all on ONE colour scale (0 to the largest weight of any head of that text, a colour bar above them; a
per-map switch puts one map on its own contrast and says so), tokens on both axes, and a badge per head with the
attention doctor's verdict read from the checkpoint (inference/verdicts.py; figures on hover). Hovering a token or a
map cell marks that query's row (and the key's column) in every map. Texts are HTML-escaped and tokens set as
textContent: never markup.

One design, two pages: the cards are drawn in the browser from the JSON objects `predict.py --explain --attention`
prints, embedded in the file (render), or fetched from serve.py's POST /predict by its page at GET / (live_page).
The page is a Jinja template with its style and script beside it (inference/templates/): restyle it there.
"""

from functools import cache
from pathlib import Path

from data.files import write_text
from inference.explain import METHODS, SIGNED_METHODS

TITLES = {"attention": "attention (last layer)", "rollout": "attention rollout", "grad_x_input": "gradient × input",
          "integrated_gradients": "Integrated Gradients", "occlusion": "occlusion (exact)"}
TEMPLATES = Path(__file__).parent / "templates"  # page.html, its style page.css, its script page.js and live.js


@cache
def template():
    import jinja2

    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                                     undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    # tojson escapes <, >, & and ' (the data cannot close its script tag); keys keep their order (labels, methods).
    environment.policies["json.dumps_kwargs"] = {"sort_keys": False, "ensure_ascii": False}
    return environment.get_template("page.html")


def page(title: str, texts: list[dict], model: dict | None = None, verdicts: dict | None = None) -> str:
    """The one page design: the method switch and a card per text (`texts`: the objects `predict.py --explain
    --attention` prints); with `model` (serve.py's /info model) the live page's text box above them. verdicts:
    inference/verdicts.py's latest_verdicts of the checkpoint (None: no badge says more than "not examined")."""
    data = {"methods": list(METHODS), "signed": list(SIGNED_METHODS), "titles": TITLES, "texts": texts,
            "verdicts": verdicts}
    return template().render(title=title, data=data, live=model is not None, model=model)


def render(explanations, title: str = "Why did it predict that?", verdicts: dict | None = None) -> str:
    """The page for a list of inference.explain.Explanation, as a string. Attention at 3 decimals: enough for a
    colour, a sixth of the bytes."""
    return page(title, [e.to_dict(attention=True, decimals=3) for e in explanations], verdicts=verdicts)


def live_page(model: dict) -> str:
    """serve.py's page: a text box above the same cards; submitting asks POST /predict for an explanation. The
    badges are the verdicts model_info read from the checkpoint."""
    return page("Why did it predict that? (live)", [], model, model.get("verdicts"))


def write_report(explanations, path, verdicts: dict | None = None) -> None:
    """The page, written atomically (data/files.py): WriteError (one line) leaves an existing page as it was."""
    write_text(path, render(explanations, verdicts=verdicts), "report")

"""`kvctl ask`: ask an edge daemon about a knowledge base; the answer streams."""
from __future__ import annotations

import click

from kvedge.common.cli import EDGE_ADDRESS, echo_json, home_path, parse_options, proto_dict
from kvedge.common.net.tls import ca_option


@click.command("ask")
@click.argument("question")
@click.option("--kb", required=True)
@click.option("--namespace", "-n", default="default", show_default=True)
@click.option("--strategy", default="", help="reuse strategy [default: the edge's]; "
              "`kvedge strategies` lists them with their options")
@click.option("--opt", "opts", multiple=True, metavar="KEY=VALUE",
              help="an option of the strategy (repeatable), e.g. --opt tokens=8 (legolink, the "
              "edge's default) or --strategy a3 --opt ratio=0.3; `kvedge strategies` lists each one's")
@click.option("--top-k", default=0, help="segments to retrieve [default: the edge's]")
@click.option("--max-new-tokens", default=0)
@click.option("--temperature", default=0.0, show_default=True, help="0 = greedy; > 0 samples")
@click.option("--top-p", type=float, default=None, help="nucleus sampling, in (0, 1] [default: 1]")
@click.option("--seed", type=int, default=None, help="sampling seed: the same seed gives the "
              "same answer [default: unseeded]")
@click.option("--stop", "stops", multiple=True, metavar="TEXT",
              help="end the answer at this text, left out of it (repeatable, at most 4)")
@click.option("--edge", "address", default=EDGE_ADDRESS, show_default=True)
@click.option("--token", default=None, help="[default: $KVEDGE_TOKEN or the local edge token]")
@ca_option("--tls-ca", what="the edge")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object at the end")
def ask_cmd(question, kb, namespace, strategy, opts, top_k, max_new_tokens, temperature, top_p,
            seed, stops, address, token, tls_ca, as_json):
    """Ask an edge daemon a question about a knowledge base; the answer streams."""
    from kvedge.common.net.edge_client import EdgeClient
    from kvedge.common.net.rpc import read_token
    from kvedge.common.net.tls import client_tls

    options = parse_options(opts)
    with EdgeClient(address, read_token(token, home_path("edge", "edge.token")),
                    client_tls(tls_ca)) as edge:
        for event in edge.ask(namespace, kb, question, strategy=strategy, top_k=top_k,
                              max_new_tokens=max_new_tokens, options=options,
                              temperature=temperature, top_p=top_p, seed=seed, stop=stops):
            if isinstance(event, str):
                if not as_json:
                    click.echo(event, nl=False)
                continue
            if as_json:
                echo_json(proto_dict(event))
            else:
                click.echo(f"\n[{event.strategy}: TTFT {event.ttft_s:.3f} s, TPOT "
                           f"{event.tpot_s * 1000:.0f} ms, {event.tokens} tokens, segments "
                           f"{list(event.segments)}, {event.bytes_loaded / 1e6:.2f} MB of packs]",
                           err=True)


COMMANDS = [ask_cmd]

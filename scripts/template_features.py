"""One small template per Jinja construct lmx's interpreter supports (docs/chat.md).

gen_template_fixtures.py renders each with transformers' apply_chat_template (its jinja2
environment: trim_blocks, lstrip_blocks, loopcontrols, its tojson, raise_exception, namespace), so
the expected strings are jinja2's. `kwargs` become template variables; `messages` default to one
user message.
"""

D = {"b": 2, "a": 1, "name": "x", "nested": {"k": [1, 2, {"z": None}]}}
L = [3, 1, 2]
PEOPLE = [{"name": "bob", "age": 30, "tags": ["a"]}, {"name": "Alice", "age": 25},
          {"name": "carol", "age": 35, "active": True}]

FEATURES = {
    # --- whitespace control --------------------------------------------------------------------
    "trim_blocks": {"template": "{% if true %}\nyes\n{% endif %}\nend\n"},
    "lstrip_blocks": {"template": "  {% if true %}\n    a\n  {% endif %}\n  {{ 'v' }}\n\t{# c #}\nz"},
    "dash_strip": {"template": "a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}\n  c {{- ' d ' -}} e"},
    "plus_modifiers": {"template": "x\n  {%+ if true +%}\ny\n{% endif %}\n{#+ keep +#}\nz"},
    "comments": {"template": "a{# one #}b\n{# two\nlines #}\nc {#- trimmed -#} d"},
    "raw_block": {"template": "{% raw %}{{ not rendered }} {% if %}{% endraw %}\nafter"},
    "raw_block_newlines": {"template": "a\n  {% raw %}\n  {{ x }}\n  {% endraw %}\nb {%- raw -%}  c  {%- endraw %}"},
    "crlf_and_trailing_newline": {"template": "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n"},
    # --- literals and output -------------------------------------------------------------------
    "literals": {"template": "{{ 1 }} {{ -2 }} {{ 1.5 }} {{ 1e3 }} {{ 2.50 }} {{ 1_000 }} {{ true }} "
                             "{{ False }} {{ none }} {{ 'it''s' }} {{ \"q\\\"\\n\\t\\u00e9\" }} {{ 'a' 'b' }}"},
    "python_reprs": {"template": "{{ [1, 'a', none, true, 1.0] }}|{{ {'k': 'v', 'n': [1]} }}|{{ d }}|"
                                 "{{ \"it's\" }}|{{ [\"it's\", 'say \"hi\"', 'x\\ny'] }}|{{ people[0] }}",
                     "kwargs": {"d": D, "people": PEOPLE}},
    "floats": {"template": "{{ 0.1 + 0.2 }} {{ 1/3 }} {{ 10/2 }} {{ 1e16 }} {{ 1e-5 }} {{ 123456.789 }} "
                           "{{ 2**0.5 }} {{ -0.0 }} {{ 1e22 }} {{ 0.0001 }}"},
    "undefined_renders_empty": {"template": "[{{ nope }}][{{ d.missing }}][{{ l[10] }}]",
                                "kwargs": {"d": D, "l": L}},
    # --- expressions -----------------------------------------------------------------------------
    "arithmetic": {"template": "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7.5 % 2 }} {{ 2 ** 10 }} "
                               "{{ 2 ** -1 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 10 - 3 - 2 }} {{ 3 * 'ab' }} "
                               "{{ [1] * 2 }} {{ [1] + [2] }} {{ 'a' + 'b' }} {{ true + 1 }}"},
    "concat_tilde": {"template": "{{ 'n=' ~ 5 ~ none ~ true ~ [1] ~ nope }}"},
    "comparisons": {"template": "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} "
                                "{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 2 >= 2 }} {{ 'x' == 'x' }} {{ none == none }} "
                                "{{ nope == none }} {{ {'a': 1} == {'a': 1} }}"},
    "logic": {"template": "{{ 0 or 'x' }} {{ '' and 'y' }} {{ 1 and 2 }} {{ not [] }} {{ not 'a' }} "
                          "{{ none or [] or 0 }} {{ nope or 'dflt' }} {{ not nope }} "
                          "{{ 'yes' if [] else 'no' }} {{ 'a' if 1 }}|{{ 'b' if 0 }}|"},
    "membership": {"template": "{{ 'ell' in 'hello' }} {{ 2 in [1, 2] }} {{ 'a' in {'a': 1} }} "
                               "{{ 'z' not in 'abc' }} {{ 3 not in [3] }} {{ 'b' in d }}",
                   "kwargs": {"d": D}},
    "subscripts_slices": {"template": "{{ l[0] }} {{ l[-1] }} {{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} "
                                      "{{ l[::2] }} {{ s[1:3] }} {{ s[-2:] }} {{ s[::-1] }} {{ s[0] }} "
                                      "{{ d['a'] }} {{ d.b }} {{ d.nested.k[2].z }} {{ l.0 }} {{ l[5:] }}",
                          "kwargs": {"l": L, "s": "héllo", "d": D}},
    "non_string_keys": {"template": "{% set d = {0: 'a', 512: 'b', 1.0: 'c', true: 'd', none: 'n', 'k': 1} %}{{ d }} "
                                    "{{ d[0] }}{{ d[1] }}{{ d[512] }}{{ d[none] }} {{ d | tojson }} {{ 0 in d }} {{ 7 in d }} "
                                    "{{ d.get(512) }} {% for k in d %}{{ k is number }}{% endfor %} "
                                    "{% for k, v in {2: 'x', 1: 'y'} | dictsort %}{{ k + 1 }}{{ v }}{% endfor %}"},
    "tuples_lists_dicts": {"template": "{% set t = (1, 2) %}{{ t[1] }} {{ [1, [2, 3]][1][0] }} "
                                       "{{ {'a': {'b': 'c'}}['a']['b'] }} {{ ('x',) | length }}"},
    "string_percent_format": {"template": "{{ '%s and %s' % ('a', 1) }} {{ '%d%%' % 50 }} {{ '%05.2f' % 3.14159 }} "
                                          "{{ '%s' % [1, 2] }} {{ '%r' % 'q' }} {{ '%(x)s!' % {'x': 'y'} }}"},
    # --- statements ------------------------------------------------------------------------------
    "if_elif_else": {"template": "{% for n in [1, 2, 3, 0] %}{% if n == 1 %}one{% elif n == 2 %}two"
                                 "{% elif n > 2 %}many{% else %}zero{% endif %},{% endfor %}"},
    "for_loop_vars": {"template": "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}"
                                  "{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}"
                                  "{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('o', 'e') }}"
                                  "{{ loop.depth }};{% endfor %}"},
    "for_else_and_filter": {"template": "{% for x in [] %}x{% else %}empty{% endfor %}|"
                                        "{% for m in messages if m.role != 'system' %}{{ loop.index }}{{ m.role }}"
                                        "{{ loop.length }}{% endfor %}|{% for x in [1, 2] if x > 5 %}{% else %}none{% endfor %}",
                            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                                         {"role": "assistant", "content": "a"}]},
    "for_unpack_dict": {"template": "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|"
                                    "{% for k in d %}{{ k }}{% endfor %}|{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}|"
                                    "{% for c in 'hé' %}[{{ c }}]{% endfor %}|{% for k, v in d | dictsort %}{{ k }}{% endfor %}",
                        "kwargs": {"d": D}},
    "nested_loops": {"template": "{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{{ a }}{{ b }} "
                                 "{% endfor %}{{ loop.index }}|{% endfor %}"},
    "break_continue": {"template": "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}"
                                   "{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %}"},
    "set_scoping": {"template": "{% set x = 1 %}{% for i in [1, 2] %}[{{ x }}]{% set x = i * 10 %}({{ x }}){% endfor %}"
                                "{{ x }}{% if true %}{% set x = 5 %}{% endif %}{{ x }}{% set a, b = [7, 8] %}{{ a }}{{ b }}"},
    "namespace": {"template": "{% set ns = namespace(found=false, count=0, last=none) %}{% for m in messages %}"
                              "{% if m.role == 'user' %}{% set ns.found = true %}{% set ns.count = ns.count + 1 %}"
                              "{% set ns.last = m.content %}{% endif %}{% endfor %}{{ ns.found }} {{ ns.count }} {{ ns.last }}"
                              "{% set ns2 = namespace({'a': 1}, b=2) %} {{ ns2.a }}{{ ns2.b }}",
                  "messages": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a"},
                               {"role": "user", "content": "u2"}]},
    "block_set": {"template": "{% set body %}\nHello {{ 'w' }}\n{% endset %}[{{ body }}]{% set up | upper | trim %} x y {% endset %}[{{ up }}]"},
    "macros": {"template": "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
                           "{{ greet('a') }} {{ greet('b', '?') }} {{ greet(punct='.', name='c') }}"
                           "{% macro va(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %} {{ va(1, 2, z=3) }}"
                           "{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %} {{ rec(3) }}"
                           "{% macro dflt(a, b=a ~ '!') %}{{ b }}{% endmacro %} {{ dflt('x') }}"},
    "call_block": {"template": "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}"
                               "{% call wrap('b') %}inner {{ 1 + 1 }}{% endcall %}"
                               "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}"
                               "{% call(x) each([1, 2]) %}[{{ x }}]{% endcall %}"},
    "filter_block": {"template": "{% filter upper %}abc {{ 'd' }}{% endfilter %}{% filter replace('a', 'o') | title %}banana split{% endfilter %}"},
    "with_block": {"template": "{% with a = 1, b = 'x' %}{{ a }}{{ b }}{% endwith %}[{{ a }}]"},
    "generation_block": {"template": "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"},
    "raise_exception": {"template": "{% if messages[0].role != 'system' %}{{ raise_exception('Conversation must start with a system message') }}{% endif %}ok"},
    "strftime_and_globals": {"template": "{{ strftime_now('%Y') | length }} {{ range(3) | list }} {{ range(1, 7, 2) | list }} "
                                         "{{ range(3, 0, -1) | list }} {{ dict(a=1, b='x') }} {{ namespace is defined }}"},
    # --- tests ------------------------------------------------------------------------------------
    "tests": {"template": "{% for v in [1, 1.5, 'a', none, true, [1], {'a': 1}, nope] %}"
                          "{{ v is defined }}{{ v is undefined }}{{ v is none }}{{ v is string }}{{ v is number }}"
                          "{{ v is integer }}{{ v is float }}{{ v is boolean }}{{ v is mapping }}{{ v is iterable }}"
                          "{{ v is sequence }}{{ v is true }}{{ v is false }}{{ v is callable }};{% endfor %}"},
    "tests_with_args": {"template": "{{ 6 is divisibleby 3 }} {{ 7 is divisibleby(3) }} {{ 3 is odd }} {{ 4 is even }} "
                                    "{{ 'a' is in 'abc' }} {{ 2 is in [1, 2] }} {{ 1 is equalto 1 }} {{ 1 is eq 2 }} "
                                    "{{ 2 is gt 1 }} {{ 2 is lt 1 }} {{ 2 is ge 2 }} {{ 1 is le 0 }} {{ 1 is ne 2 }} "
                                    "{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ none is sameas none }} "
                                    "{{ x is not defined }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ 1 is == 1 }}"},
    # --- filters ----------------------------------------------------------------------------------
    "filters_strings": {"template": "{{ '  a b  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ 'hello wORLD' | title }}|"
                                    "{{ 'hello wORLD' | capitalize }}|{{ 'AbC' | lower }}|{{ 'AbC' | upper }}|"
                                    "{{ 'a-a-a' | replace('a', 'b') }}|{{ 'a-a-a' | replace('a', 'b', 2) }}|"
                                    "{{ 'abc' | center(9) }}|{{ 'one two  three' | wordcount }}|{{ 'x<y&\"z\"' | e }}|"
                                    "{{ 'x<y' | escape }}|{{ 'x' | safe }}|{{ 'abc' | reverse }}|{{ 'é' | length }}|"
                                    "{{ 'a b c d e f' | truncate(5) }}|{{ 'hello world foo' | truncate(9, true) }}|"
                                    "{{ '%s-%s' | format('a', 2) }}|{{ 'x' | string }}|{{ 42 | string }}|{{ 'ab' | list }}"},
    "filter_indent": {"template": "{{ 'a\nb\n\nc' | indent }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | indent(2, blank=true) }}|"
                                  "{{ 'a\nb' | indent('> ') }}"},
    "filters_numbers": {"template": "{{ -3 | abs }} {{ -2.5 | abs }} {{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} "
                                    "{{ 'x' | int(7) }} {{ '0x1A' | int(0, 16) }} {{ 3.9 | int }} {{ '2.5' | float }} {{ 'y' | float }} "
                                    "{{ 3 | float }} {{ 2.567 | round }} {{ 2.567 | round(2) }} {{ 2.5 | round }} "
                                    "{{ 2.1 | round(0, 'ceil') }} {{ 2.9 | round(method='floor') }} {{ 3 | round }} "
                                    "{{ [1, 2, 3] | sum }} {{ [1.5, 2] | sum }} {{ people | sum(attribute='age') }} {{ [1] | sum(start=10) }}",
                        "kwargs": {"people": PEOPLE}},
    "filters_sequences": {"template": "{{ l | length }} {{ l | count }} {{ l | first }} {{ l | last }} {{ l | min }} {{ l | max }} "
                                      "{{ l | sort }} {{ l | sort(reverse=true) }} {{ ['b', 'A', 'c'] | sort }} "
                                      "{{ ['b', 'A', 'c'] | sort(case_sensitive=true) }} {{ l | reverse | list }} "
                                      "{{ l | join(', ') }} {{ l | join }} {{ [1, 2, 1, 3] | unique | list }} "
                                      "{{ ['a', 'A', 'b'] | unique | list }} {{ range(7) | batch(3) | list }} "
                                      "{{ range(5) | batch(2, 'x') | list }} {{ 'abc' | first }} {{ d | first }} {{ d | length }}",
                          "kwargs": {"l": L, "d": D}},
    "filters_attributes": {"template": "{{ people | map(attribute='name') | join(',') }}|{{ people | map(attribute='x', default='-') | list }}|"
                                       "{{ ['a', 'b'] | map('upper') | list }}|{{ people | selectattr('active') | map(attribute='name') | list }}|"
                                       "{{ people | rejectattr('active') | map(attribute='name') | list }}|"
                                       "{{ people | selectattr('age', 'gt', 26) | map(attribute='name') | list }}|"
                                       "{{ people | selectattr('name', 'equalto', 'bob') | list | length }}|"
                                       "{{ [1, 2, 3, 4] | select('odd') | list }}|{{ [1, 2, 3, 4] | reject('odd') | list }}|"
                                       "{{ [0, 1, '', 'a', none] | select | list }}|{{ people | sort(attribute='age') | map(attribute='name') | list }}|"
                                       "{{ people | sort(attribute='name') | map(attribute='name') | list }}|"
                                       "{{ people | max(attribute='age') }}|{{ people | min(attribute='name') }}|"
                                       "{{ people | map(attribute='tags.0') | list }}|{{ people[0] | attr('name') }}|"
                                       "{{ people | unique(attribute='active') | list | length }}",
                           "kwargs": {"people": PEOPLE}},
    "filters_dicts": {"template": "{{ d | items | list }}|{{ d | dictsort }}|{{ d | dictsort(reverse=true) }}|"
                                  "{{ {'b': 1, 'a': 2} | dictsort(by='value') }}|{{ {'B': 1, 'a': 2} | dictsort }}|"
                                  "{{ {'B': 1, 'a': 2} | dictsort(true) }}|{{ d | list }}|{{ nope | items | list }}",
                      "kwargs": {"d": D}},
    "filter_default": {"template": "{{ nope | default('d') }}|{{ nope | d }}|{{ none | default('d') }}|{{ '' | default('d') }}|"
                                   "{{ '' | default('d', true) }}|{{ 0 | d('z', boolean=true) }}|{{ d.missing | default(3) }}|"
                                   "{{ x | default(x) }}", "kwargs": {"d": D}},
    "tojson": {"template": "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ l | tojson(indent=4) }}|{{ 'é\"\\n<>&' | tojson }}|"
                           "{{ [1.0, 0.5, 1e20, none, true] | tojson }}|{{ d | tojson(sort_keys=true) }}|"
                           "{{ {} | tojson(indent=2) }}|{{ [] | tojson }}|{{ 'é' | tojson(ensure_ascii=true) }}|"
                           "{{ tools | tojson }}|{{ d | tojson(separators=(',', ':')) }}|{{ '\\u0001\\t' | tojson }}",
               "kwargs": {"d": D, "l": L},
               "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "z": 1, "a": [1]}}}]},
    # --- methods ----------------------------------------------------------------------------------
    "string_methods": {"template": "{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  x'.lstrip() }}|{{ 'x  \n'.rstrip() }}|"
                                   "{{ '\nx\n'.rstrip('\n') }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith('bc') }}|"
                                   "{{ 'abc'.startswith(('x', 'a')) }}|{{ 'a b  c'.split() }}|{{ 'a,b,,c'.split(',') }}|"
                                   "{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ ' a b '.split(' ') }}|"
                                   "{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}|{{ 'hello world'.title() }}|"
                                   "{{ 'hELLO'.capitalize() }}|{{ 'héllo'.find('l') }}|{{ 'hello'.rfind('l') }}|{{ 'x'.find('z') }}|"
                                   "{{ 'banana'.count('a') }}|{{ '-'.join(['a', 'b']) }}|{{ '{} and {}'.format('x', 1) }}|"
                                   "{{ '{0}{name}'.format('p', name='q') }}|{{ 'a\nb\r\nc'.splitlines() }}|{{ '12'.isdigit() }}|"
                                   "{{ 'ab'.isalpha() }}|{{ ' '.isspace() }}|{{ 'AB'.isupper() }}|{{ 'ab'.islower() }}|"
                                   "{{ 'x</think>y'.split('</think>')[-1] }}|{{ 'a'.split('a') }}"},
    "dict_methods": {"template": "{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }} {{ d.keys() | list }} "
                                 "{{ d.values() | list }} {{ d.items() | list }} {{ d['name'] }} {{ d.name }}",
                     "kwargs": {"d": D}},
    "unsafe_list_append": {"template": "{% set l = [] %}{{ l.append(1) }}{{ l }}"},
    "message_fields": {"template": "{% for m in messages %}{{ m.role }}:{% if m.content is string %}{{ m.content }}"
                                   "{% else %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}"
                                   "{% if m.tool_calls is defined %}{% for tc in m.tool_calls %}{{ tc.function.name }}"
                                   "{{ tc.function.arguments | tojson }}{% endfor %}{% endif %}"
                                   "{% if 'reasoning_content' in m %}<{{ m.reasoning_content }}|{{ m.thinking }}>{% endif %}"
                                   "{{ m.keys() | list }};{% endfor %}",
                       "messages": [{"role": "user", "content": [{"type": "text", "text": "p1"}, {"type": "text", "text": "p2"}]},
                                    {"role": "assistant", "content": None, "tool_calls": [
                                        {"type": "function", "function": {"name": "f", "arguments": {"b": 1, "a": "x"}}}]},
                                    {"role": "assistant", "content": "c", "reasoning_content": "r"},
                                    {"role": "assistant", "content": "c", "reasoning": "r2", "extra": 1}]},
    "add_generation_prompt": {"template": "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}<gen>{% endif %}"
                                          "{{ bos_token }}{{ eos_token }}{{ tools is none }}{{ documents is none }}",
                              "agp": [True, False]},
    "markup": {"template": "{{ 'a<' | safe + '<b>' }}|{{ ('x' | e) + '&' }}|{{ '<' | e | e }}|{{ '<' + ('&' | safe) }}|"
                           "{{ ('<p>' | safe).upper() + '<' }}|{{ 'a' ~ ('<' | safe) ~ '>' }}|{{ ['<' | safe] }}|"
                           "{{ ('<' | safe | trim) + '>' }}|{{ (('<' | safe) | string) + '>' }}|{{ ('<' | safe) | tojson }}|"
                           "{{ ['<' | safe, '>'] | join }}|{{ ('<' | safe) == '<' }}"},
    "generators": {"template": "{% if [] | select %}truthy{% endif %}|{% if [] | list %}no{% endif %}|"
                               "{{ [1, 2] | map('string') | join }}|{{ [1, 2, 3] | select('odd') | list }}|"
                               "{{ [3, 1] | reverse | list }}|{{ d | items | list }}|{{ [1, 1] | unique | list }}|"
                               "{{ [1, 2] | map('string') | first }}|{{ 1 in [1, 2] | select }}",
                   "kwargs": {"d": {"a": 1}}},
    "error_generator_length": {"template": "{{ [1] | map('string') | length }}"},
    "error_generator_tojson": {"template": "{{ [1] | select | tojson }}"},
    # --- errors -------------------------------------------------------------------------------------
    "error_undefined_attribute": {"template": "{{ nope.attr }}"},
    "error_type": {"template": "{{ 'a' + 1 }}"},
    "error_syntax": {"template": "{% if %}x{% endif %}"},
    "error_unclosed": {"template": "{% for x in y %}x"},
    "error_unknown_filter": {"template": "{{ 1 | no_such_filter }}"},
}

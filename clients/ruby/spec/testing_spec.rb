# frozen_string_literal: true

require "spec_helper"

RSpec.describe "the test helpers (topology_claims/testing)" do
  let(:cell) { SpecSupport.cell(:sqlite, "a") }

  it "pre-claims a name as another cell, committed, and the matchers and assertions see who holds it" do
    name = unique("pre")
    owner = "rb-other-#{SecureRandom.hex(3)}"
    TopologyClaims::Testing.claim_as(owner, namespace: "usernames", value: name, config: cell.config)
    expect(owner).to have_claim("usernames", name.upcase, config: cell.config)
    expect(cell.cell_id).not_to have_claim("usernames", name, config: cell.config)
    user = cell.user.new(username: name)
    expect(user.save).to be(false)
    expect(user.errors[:username]).to include("has already been taken")

    free = unique("free")
    expect { cell.user.create!(username: free) }.to claim("usernames", free, config: cell.config)
    expect { nil }.not_to claim("usernames", unique("never"), config: cell.config)

    # Minitest's assert, as a test case includes it.
    test = Object.new.extend(TopologyClaims::Testing::Assertions)
    def test.assert(condition, message) = condition || raise(message)
    test.assert_claimed("usernames", free, config: cell.config)
    test.assert_claimed("usernames", name, cell_id: owner, config: cell.config)
    test.refute_claimed("usernames", unique("nobody"), config: cell.config)
    expect { test.refute_claimed("usernames", free, config: cell.config) }
      .to raise_error(RuntimeError, /unclaimed, held by \["#{cell.cell_id}", :active\]/)
  end
end
